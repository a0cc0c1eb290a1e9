"""RL step time, synchronous (rollout.max_staleness 0) vs one step off-policy (1), on the demo.

The demo setting (configs/demo.yaml: the warm-started tiny Qwen2 on an NVFP4 base, 16 prompts x
8 samples, vLLM in-process + 2 FSDP2 ranks + LoRA), shortened to `--steps` steps with no eval.
Each setting is `staleness:engine_threads`; the runs go round-robin (`--rounds` times through
the settings), so a load change on the machine hits every setting alike. Every run is a fresh
`rlvr train` process. Figures are medians over the steps after the first (whose time includes
warm-up, and with staleness 1 two generations).

    python benchmarks/async_pipeline.py --out runs/bench_async.json

With staleness 1, time/overlap is the seconds in which the engine and the ranks worked at once.
Appends a line to docs/benchmarks.md (command, machine, date, figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from _ledger import append_line, provenance, write_result
from rich.console import Console

from rlvr.config import load_config
from rlvr.demo import ensure_demo_assets

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("time/step", "time/generate", "time/train", "time/overlap", "time/sync", "time/score")


def run_config(args, work: Path, name: str, staleness: int, engine_threads: int) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg.update(run_dir=str(work / name), steps=args.steps)
    cfg["model"]["path"] = str(work / "assets" / "model")
    cfg["data"].update(
        train=str(work / "assets" / "task" / "train.jsonl"), test=str(work / "assets" / "task" / "test.jsonl")
    )
    cfg["demo"]["warm_start"].update(
        steps=args.warm_start_steps, check=None
    )  # the fixed warm start its figures were measured with
    cfg["engine"]["num_threads"] = engine_threads
    cfg["rollout"]["max_staleness"] = staleness
    cfg["tracking"] = {"progress": False}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ensure_demo_assets(load_config(path), Console(quiet=True))  # built once, by the first run
    cfg["data"]["test"] = None  # no eval: only RL steps are timed
    path.write_text(yaml.safe_dump(cfg))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--settings", default="0:2,1:1,1:2", help="staleness:engine_threads, comma separated")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_async")
    parser.add_argument("--warm-start-steps", type=int, default=400, help="the demo's warm start (its default: 400)")
    args = parser.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    settings = [tuple(int(x) for x in item.split(":")) for item in args.settings.split(",")]
    per_setting: dict[str, dict[str, list[float]]] = {
        f"staleness{s}_threads{t}": {k: [] for k in FIGURES} for s, t in settings
    }
    for round_index in range(args.rounds):
        for staleness, threads in settings:
            key = f"staleness{staleness}_threads{threads}"
            path = run_config(args, args.work, f"{key}_round{round_index}", staleness, threads)
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "rlvr.cli", "train", str(path)], capture_output=True, text=True
            )
            if done.returncode != 0:
                sys.exit(f"{key}: rlvr train failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
            rows = [json.loads(line) for line in (args.work / path.stem / "metrics.jsonl").read_text().splitlines()]
            rows = [r for r in rows if "reward/mean" in r and r["step"] > 1]
            for figure in FIGURES:
                per_setting[key][figure] += [r.get(figure, 0.0) for r in rows]
            print(
                f"{key} round {round_index}: {time.perf_counter() - started:.0f} s, "
                f"median step {statistics.median(r['time/step'] for r in rows):.2f} s",
                flush=True,
            )

    medians = {
        key: {k: round(statistics.median(v), 3) for k, v in figures.items()} for key, figures in per_setting.items()
    }
    sync_key = next(k for k in medians if k.startswith("staleness0"))
    best_async = min((k for k in medians if k.startswith("staleness1")), key=lambda k: medians[k]["time/step"])
    result = {
        "medians": medians,
        "speedup": round(medians[sync_key]["time/step"] / medians[best_async]["time/step"], 3),
        "speedup_of": f"{best_async} over {sync_key}",
        "steps_per_run": args.steps,
        "rounds": args.rounds,
        "trainer_threads_per_rank": max(1, (os.cpu_count() or 1) // 2),
    } | provenance()
    write_result(args.out, result)
    figures = "; ".join(
        f"{key}: step {m['time/step']} s (generate {m['time/generate']}, train {m['time/train']}, overlap {m['time/overlap']})"
        for key, m in medians.items()
    )
    append_line(
        f"demo RL step, max_staleness 0 vs 1 (medians of steps 2-{args.steps}, {args.rounds} round(s)): {figures}; "
        f"**{result['speedup']}x** ({result['speedup_of']})",
        result,
    )


if __name__ == "__main__":
    main()
