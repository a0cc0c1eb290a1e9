"""Fully asynchronous RL against synchronous on the long-tail workload: wall time to the same
number of trained groups, and held-out avg@8 after them.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/async_longtail.py --out runs/bench/async_longtail.json

The workload is `vs_trl.py --workload longtail`'s (its model and task, built there once): the
counting task, completions of ~20 to 512 tokens, most short. For each seed, rlvr trains
`--steps` steps synchronously (`rollout.mode: sync`) and fully asynchronously
(`rollout.mode: async`, `rollout.max_staleness: K`), the same prompts_per_step groups a step,
so the same number of trained groups. Everything else is the same config.

- `speedup`: the summed step times of the synchronous runs over those of the asynchronous ones
  (each step's generate, score, train, sync, and the async drain before the last checkpoint);
  per seed in `seeds`.
- `avg8_sync`, `avg8_async`: held-out avg@8 of the final adapters, means over seeds, all
  evaluated by one rlvr evaluator on one engine (vs_trl.evaluate_adapters); `paired_se` is the
  standard error of the per-seed differences (async - sync), the noise the comparison is within.
- `staleness_max`: the largest `rollout/staleness_max` any async step logged (bounded by K);
  `dropped_stale`: the groups the async runs dropped as too stale, in all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ledger import append_line, provenance, write_result  # noqa: E402
from vs_trl import DEMO_CONFIG, WORKLOADS, bench_overrides, ensure_task, evaluate_adapters, held_out_file  # noqa: E402

WORKLOAD = WORKLOADS["longtail"]


def run(overrides: list[str], run_dir: Path, log) -> list[dict]:
    """`rlvr train` in a process of its own (a run that finished before, its summary written, is
    kept); its per-step metrics."""
    started = time.time()
    command = [sys.executable, "-m", "rlvr.cli", "train", DEMO_CONFIG, *overrides, f"run_dir={run_dir}"]
    done = None if (run_dir / "summary.json").exists() else subprocess.run(command, capture_output=True, text=True)
    if done is not None and done.returncode != 0:
        raise RuntimeError(f"rlvr train {run_dir} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    log(f"{run_dir}: {time.time() - started:.0f} s")
    return [row for row in rows if "reward/mean" in row]


def paired_se(differences: list[float]) -> float:
    """Standard error of the mean of paired differences (0 with one pair: no spread to measure)."""
    return statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-staleness", type=int, default=2, help="K of the async runs")
    parser.add_argument("--held-out", type=int, default=WORKLOAD.held_out, help="held-out problems evaluated")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/async_longtail"))
    parser.add_argument("--rlvr", action="append", default=[], metavar="KEY=VALUE", help="extra config override (both modes)")
    parser.add_argument("--async-rlvr", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override of the async runs only (e.g. engine.num_threads=1)")
    args = parser.parse_args()
    from rich.console import Console

    from rlvr.config import load_config
    from rlvr.demo import ensure_demo_assets

    console = Console()
    log = console.print
    # checkpoint.every = steps: only the final adapter, the one evaluated
    base = bench_overrides(WORKLOAD.assets, str(args.run_dir), args.steps, args.prompts, args.samples,
                           WORKLOAD.max_tokens, args.steps, [*WORKLOAD.overrides, *args.rlvr])
    build_cfg = load_config(DEMO_CONFIG, base + [f"data.test={WORKLOAD.assets}/task/test.jsonl"])
    ensure_task(build_cfg, WORKLOAD)
    ensure_demo_assets(build_cfg, console)
    cfg = load_config(DEMO_CONFIG, base)
    test_file = held_out_file(cfg, args.held_out, WORKLOAD)

    modes = {"sync": ["rollout.mode=sync", "rollout.max_staleness=0"],
             "async": ["rollout.mode=async", f"rollout.max_staleness={args.max_staleness}", *args.async_rlvr]}
    steps: dict[str, dict[int, list[dict]]] = {mode: {} for mode in modes}
    for seed in args.seeds:
        for mode, mode_overrides in modes.items():  # the two modes of a seed back to back: the same machine state
            run_dir = args.run_dir / f"{mode}_s{seed}"
            steps[mode][seed] = run([*base, *mode_overrides, f"seed={seed}"], run_dir, log)
    adapters: dict[str, Path | None] = {"base": None} | {
        f"{mode}_s{seed}": args.run_dir / f"{mode}_s{seed}" / "checkpoints" / f"step_{args.steps:06d}" / "adapter"
        for seed in args.seeds for mode in modes
    }
    avg8 = {name: r["avg@8"] for name, r in evaluate_adapters(cfg, test_file, None, adapters, args.run_dir / "eval", log).items()}

    per_seed = {}
    for seed in args.seeds:
        seconds = {mode: sum(row["time/step"] for row in steps[mode][seed]) for mode in modes}
        async_rows = steps["async"][seed]
        per_seed[seed] = {
            "sync_s": round(seconds["sync"], 1), "async_s": round(seconds["async"], 1),
            "speedup": round(seconds["sync"] / seconds["async"], 3),
            "avg8_sync": avg8[f"sync_s{seed}"], "avg8_async": avg8[f"async_s{seed}"],
            "staleness_max": max(row["rollout/staleness_max"] for row in async_rows),
            "staleness_mean": round(statistics.mean(row["rollout/staleness_mean"] for row in async_rows), 3),
            "dropped_stale": int(sum(row["rollout/dropped_stale"] for row in async_rows)),
            # the last step generates nothing ahead: no time/generate there
            **{f"{mode}_{part}_s": round(sum(row.get(f"time/{part}", 0.0) for row in steps[mode][seed]), 1)
               for mode in modes for part in ("generate", "train", "drain")},
            "length_p90_sync": statistics.median(row["response/length_p90"] for row in steps["sync"][seed]),
            "length_p90_async": statistics.median(row["response/length_p90"] for row in async_rows),
        }
    total = {mode: sum(per_seed[s][f"{mode}_s"] for s in args.seeds) for mode in modes}
    differences = [per_seed[s]["avg8_async"] - per_seed[s]["avg8_sync"] for s in args.seeds]
    result = {
        "speedup": round(total["sync"] / total["async"], 3),
        "avg8_sync": round(statistics.mean(per_seed[s]["avg8_sync"] for s in args.seeds), 4),
        "avg8_async": round(statistics.mean(per_seed[s]["avg8_async"] for s in args.seeds), 4),
        "paired_se": round(paired_se(differences), 4),
        "staleness_max": max(per_seed[s]["staleness_max"] for s in args.seeds),
        "max_staleness": args.max_staleness,
        "dropped_stale": sum(per_seed[s]["dropped_stale"] for s in args.seeds),
        "avg8_base": avg8["base"],
        "trained_groups_per_run": args.steps * args.prompts,
        "seeds": per_seed,
        "settings": {"steps": args.steps, "prompts": args.prompts, "samples": args.samples,
                     "max_tokens": WORKLOAD.max_tokens, "held_out": args.held_out, "extra": args.rlvr,
                     "async_extra": args.async_rlvr},
    } | provenance()
    write_result(args.out, result)
    append_line(
        f"async (K={args.max_staleness}) vs sync, long-tail workload, {len(args.seeds)} seeds x {args.steps} steps of "
        f"{args.prompts}x{args.samples}: **speedup {result['speedup']}** ({total['sync']:.0f} s vs {total['async']:.0f} s "
        f"of steps); held-out avg@8 sync {result['avg8_sync']} vs async {result['avg8_async']} (base "
        f"{result['avg8_base']}, paired SE {result['paired_se']}); staleness_max {result['staleness_max']}, "
        f"{result['dropped_stale']} groups dropped stale", result)


if __name__ == "__main__":
    main()
