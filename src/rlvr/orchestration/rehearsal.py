"""`rlvr rehearse CONFIG`: what a run does before its first step, at the config's real size, on
one CPU machine, checked against the plan.

    report = rehearse(cfg)      # {"ok", "nodes", "actors", "ranks", "checks"}

- Ray (`place`): a simulated cluster (`ray.cluster_utils.Cluster`) of `placement.nodes` nodes
  with `gpus_per_node` logical GPUs each, and on it the run's own placement group and actors
  (`RayCluster`, `place_ranks`, `place_engine`), left empty: nothing loads weights or touches
  CUDA. Each actor reports its node, its bundle, the GPUs Ray gave it (what its
  CUDA_VISIBLE_DEVICES says), its rendezvous, and for the engine the executor backend vLLM's own
  `ParallelConfig` resolves to inside it.
- Sharding: `rlvr.training.sharding_rehearsal.measure_ranks` shards the full model on meta at
  the config's world size; the first, a middle and the last rank's bytes go next to
  `rlvr.planning.rank_memory.rank_bytes`. With trainer.backend megatron,
  `rlvr.training.megatron.rehearsal.measure_megatron_ranks` builds those ranks' part of
  megatron-core's model on meta under the config's layout, next to `megatron_rank_bytes`; a
  layout or model the Megatron rank does not build (pipeline stages, a family it does not
  convert) is planned unmeasured, and the record says why and fails on it.

ok needs one actor per engine replica, every engine's TP group in its one actor on one node with
an executor that keeps the workers there, no GPU held twice (split), each HSDP replica's ranks on one node (where shard_ranks <= gpus_per_node), and
every measured figure within `TOLERANCE` of the plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import groupby

from rlvr.config import PlacementConfig, RunConfig
from rlvr.orchestration.ray_placement import RayCluster, _import_ray, number_nodes
from rlvr.planning.placement import plan_layout

TOLERANCE = 0.02  # measured bytes may differ from the plan's by this share
# Plasma's floor is ~75 MB; the rehearsal's actors send a few small dicts.
NODE_OBJECT_STORE_BYTES = 80 << 20
EXECUTORS_IN_ACTOR = ("mp", "uni")  # vLLM's executors whose workers are the engine process's own


@contextmanager
def simulated_cluster(placement: PlacementConfig, cpus: float) -> Iterator[str]:
    """Ray on this machine as `placement.nodes` nodes of `gpus_per_node` logical GPUs (and enough
    logical CPUs for the plan's `cpus`), this process connected; yields its address."""
    ray = _import_ray()
    from ray.cluster_utils import Cluster

    gpus = placement.gpus_per_node
    node = {
        "num_cpus": gpus or math.ceil(cpus / placement.nodes),
        "num_gpus": gpus,
        "object_store_memory": NODE_OBJECT_STORE_BYTES,
    }
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        for _ in range(placement.nodes - 1):
            cluster.add_node(wait=False, **node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def place(cfg: RunConfig) -> list[dict]:
    """The run's actors, placed on a simulated cluster as a real run places them: the trainer
    ranks in rank order, then the engine. Raises ValueError where the placement cannot hold the run."""
    placement, ranks, replicas = cfg.placement, cfg.trainer.ranks, cfg.engine.replicas
    tp = cfg.engine.tensor_parallel_size
    with simulated_cluster(placement, plan_layout(placement, ranks=ranks, engines=replicas, tp=tp).cpus) as address:
        cluster = RayCluster(placement.model_copy(update={"ray_address": address}), ranks, replicas, tp)
        try:
            trainer, (host, port) = cluster.place_ranks()
            engines = [cluster.place_engine(cfg.engine, replica) for replica in range(replicas)]
        finally:
            cluster.close()  # its actors go with its placement group
    nodes = number_nodes([*trainer, *engines])
    trainer_records = [
        _record(placed, "trainer", rank, nodes, rendezvous=f"{host}:{port}", executor_backend=None)
        for rank, placed in enumerate(trainer)
    ]
    return trainer_records + [
        _record(engine, "engine", replica, nodes, rendezvous=None, executor_backend=engine.where["executor_backend"])
        for replica, engine in enumerate(engines)
    ]


def _record(placed, role: str, rank: int, nodes: dict[str, int], **extra) -> dict:
    where = placed.where
    return {
        "role": role,
        "rank": rank,
        "node": nodes[where["node_id"]],
        "bundle": placed.bundle,
        "gpus": where["gpus"],
        "cuda_visible_devices": where["cuda_visible_devices"],
        **extra,
    }


def placement_failures(cfg: RunConfig, actors: list[dict]) -> list[str]:
    """What is wrong with the actors' layout, one line each (empty: nothing)."""
    failures = []
    tp, gpus_per_node = cfg.engine.tensor_parallel_size, cfg.placement.gpus_per_node
    engines = [a for a in actors if a["role"] == "engine"]
    if len(engines) != cfg.engine.replicas:
        failures.append(f"{len(engines)} engine actor(s) placed for engine.replicas={cfg.engine.replicas}")
    for engine in engines:
        if gpus_per_node and len(engine["gpus"]) != tp:
            failures.append(
                f"engine {engine['rank']}: its actor holds GPUs {engine['gpus']} of node {engine['node']}, "
                f"not its TP group of {tp}"
            )
        if cfg.engine.backend == "vllm" and engine["executor_backend"] not in EXECUTORS_IN_ACTOR:
            failures.append(
                f"engine {engine['rank']}: vLLM resolves executor {engine['executor_backend']!r}, "
                "whose workers leave the engine's actor"
            )
    trainer = [a for a in actors if a["role"] == "trainer"]
    nodes = [a["node"] for a in trainer]
    if nodes != sorted(nodes):
        failures.append(f"trainer ranks are not ordered by node: nodes {nodes}")
    shard_ranks = cfg.trainer.shard_ranks or cfg.trainer.ranks
    if gpus_per_node and shard_ranks <= gpus_per_node:
        for first in range(0, len(trainer), shard_ranks):
            replica = trainer[first : first + shard_ranks]
            if len({a["node"] for a in replica}) > 1:
                failures.append(
                    f"HSDP replica of ranks {first}-{first + shard_ranks - 1} spans nodes "
                    f"{sorted({a['node'] for a in replica})}"
                )
    # colocated, an engine shares its trainer rank's GPU by design; split, no GPU has two holders
    holders = trainer if cfg.placement.colocate else trainer + engines
    used = [(a["node"], gpu) for a in holders for gpu in a["gpus"]]
    if len(used) != len(set(used)):
        failures.append(f"two {'trainer ranks' if cfg.placement.colocate else 'actors'} hold the same GPU")
    return failures


def rehearsed_ranks(world_size: int) -> list[int]:
    """The first, a middle and the last rank."""
    return sorted({0, world_size // 2, world_size - 1})


def compare_bytes(cfg: RunConfig) -> list[dict]:
    """For the rehearsed ranks: the plan's bytes and those measured on the sharded meta model."""
    from rlvr.planning.lora import with_engine_lora_targets
    from rlvr.planning.rank_memory import megatron_rank_bytes, rank_bytes
    from rlvr.planning.sections import PlanSections
    from rlvr.training.megatron.rehearsal import measure_megatron_ranks, unbuilt
    from rlvr.training.sharding_rehearsal import measure_ranks

    ranks, sections = rehearsed_ranks(cfg.trainer.ranks), PlanSections.of(cfg)
    # the trainer's LoRA as the run resolves it (the plan counts it so): not kv_b_proj on MLA
    resolved = cfg.model_copy(
        update={"trainer": with_engine_lora_targets(cfg.model, cfg.trainer, sections.folder, log=lambda line: None)}
    )
    if cfg.trainer.backend == "megatron":
        why = unbuilt(cfg)  # a layout or model the Megatron rank does not build: planned, not measured
        measured = measure_megatron_ranks(resolved, ranks) if why is None else [None] * len(ranks)
        return [
            {"rank": rank, "planned": megatron_rank_bytes(sections, rank), "measured": bytes_, "unmeasured": why}
            for rank, bytes_ in zip(ranks, measured)
        ]
    measured = measure_ranks(resolved, ranks)
    return [
        {"rank": rank, "planned": rank_bytes(sections, rank), "measured": bytes_}
        for rank, bytes_ in zip(ranks, measured)
    ]


def byte_failures(ranks: list[dict]) -> list[str]:
    failures = []
    for row in ranks:
        if row["measured"] is None:
            failures.append(f"rank {row['rank']}: bytes not measured: {row['unmeasured']}")
            continue
        for name, planned in row["planned"].items():
            measured = row["measured"].get(name)
            if measured is None:
                failures.append(f"rank {row['rank']}: {name} was not measured")
            elif abs(measured - planned) > TOLERANCE * abs(planned):
                failures.append(
                    f"rank {row['rank']}: {name} measured {measured / 1e9:.3f} GB, planned "
                    f"{planned / 1e9:.3f} GB (beyond {TOLERANCE:.0%})"
                )
    return failures


def rehearse(cfg: RunConfig) -> dict:
    """The rehearsal's record (the JSON `--out` writes)."""
    actors = place(cfg)
    ranks = compare_bytes(cfg)
    failures = placement_failures(cfg, actors) + byte_failures(ranks)
    return {"ok": not failures, "nodes": cfg.placement.nodes, "actors": actors, "ranks": ranks, "failures": failures}


def summary_lines(report: dict) -> list[str]:
    """One line per role and node, one for the bytes, then ok or the first failure."""
    lines = []
    for (role, node), members in groupby(report["actors"], key=lambda a: (a["role"], a["node"])):
        group = list(members)
        numbers = str(group[0]["rank"]) if len(group) == 1 else f"{group[0]['rank']}-{group[-1]['rank']}"
        who = f"{'engine' if role == 'engine' else 'trainer rank'}{'s' * (len(group) > 1)} {numbers}"  # an engine's: its replica
        gpus = [gpu for a in group for gpu in a["gpus"]]
        line = f"{who}: node {node}" + (f", GPUs {','.join(map(str, gpus))}" if gpus else "")
        line += (
            f", executor {group[0]['executor_backend']}"
            if role == "engine"
            else f", rendezvous {group[0]['rendezvous']}"
        )
        lines.append(line)
    if report["ranks"] and report["ranks"][0]["measured"] is None:
        lines.append(f"bytes of ranks {', '.join(str(row['rank']) for row in report['ranks'])}: planned, not measured")
    elif report["ranks"]:
        gaps = [
            (abs(row["measured"].get(name, 0) - planned) / planned if planned else 0.0, row["rank"], name)
            for row in report["ranks"]
            for name, planned in row["planned"].items()
        ]
        gap, rank, name = max(gaps)
        lines.append(
            f"bytes of ranks {', '.join(str(row['rank']) for row in report['ranks'])} against the plan: "
            f"largest gap {gap:.2%} (rank {rank}, {name})"
        )
    lines.append("ok" if report["ok"] else f"not ok: {report['failures'][0]}")
    return lines
