"""Wall time of `rlvr rehearse`'s Ray half: a config's actors placed on a simulated cluster.

Times the simulated cluster alone (start and stop, nothing placed), then `place(cfg)` whole
(the cluster again, the placement group, every rank actor and the engine actor); their
difference is what placing the actors costs.

    python benchmarks/rehearsal_ray.py configs/aime_mistral_large3_nvfp4_ray.yaml --out runs/bench_rehearsal_ray.json

appends a line to docs/benchmarks.md (command, machine, date, figures).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from _ledger import append_line, provenance, write_result

from rlvr.config import load_config
from rlvr.orchestration.rehearsal import place, placement_failures, simulated_cluster
from rlvr.planning.placement import plan_layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    placement = cfg.placement
    load = os.getloadavg()[0]  # the machine may be shared: a busy one stretches every figure

    start = time.perf_counter()
    layout = plan_layout(
        placement, ranks=cfg.trainer.ranks, engines=cfg.engine.replicas, tp=cfg.engine.tensor_parallel_size
    )
    with simulated_cluster(placement, layout.cpus):
        pass
    cluster_s = time.perf_counter() - start
    start = time.perf_counter()
    actors = place(cfg)
    place_s = time.perf_counter() - start

    result = {
        **provenance(),
        "config": str(args.config),
        "overrides": args.overrides,
        "load_average": load,
        "nodes": placement.nodes,
        "gpus_per_node": placement.gpus_per_node,
        "actors": len(actors),
        "cluster_s": round(cluster_s, 1),
        "place_s": round(place_s, 1),
        "actors_s": round(place_s - cluster_s, 1),
        "failures": placement_failures(cfg, actors),
    }
    write_result(args.out, result)
    append_line(
        f"rehearsal, Ray half, {args.config.name}: {placement.nodes} simulated nodes x {placement.gpus_per_node} "
        f"GPUs, {len(actors)} actors placed in **{place_s:.1f} s** (the cluster's start and stop alone "
        f"{cluster_s:.1f} s, the actors {place_s - cluster_s:.1f} s; 1-minute load average {load:.1f} at "
        "the start); placement checks: " + ("pass" if not result["failures"] else result["failures"][0]),
        result,
    )


if __name__ == "__main__":
    main()
