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
- `bound`: (g + t) / max(g, t), g and t the synchronous runs' summed generate and train seconds:
  the most overlapping the two phases can gain where each keeps its own hardware.
- `stepwise_bound`: the same, step by step (`stepwise_overlapped_s`): step i+1 generated while
  step i trains, as the stream overlaps them.

`--split-cores` runs both modes on a split placement of this machine's cores
(rlvr.planning.cpu_split): `placement.colocate: false` with `placement.engine_cpus` half of
the cores this process may use (at least one), the controller and its engine there with a thread
per core, and one trainer rank on the rest (the model fits one rank; two ranks on one core would
take turns). On a 2-core machine: the engine on core 0, the rank on core 1.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/async_longtail.py --split-cores --out runs/bench/async_longtail_split.json
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


def stepwise_overlapped_s(rows: list[dict]) -> float:
    """The seconds the synchronous run of `rows` (its per-step generate g and train t) would take
    with step i+1 generated while step i trains and neither running further ahead:
    g_1 + sum over i<N of max(t_i, g_i+1) + t_N. rlvr's stream steps the engine only inside a
    step's collection (what keeps an async run reproducible), so this is what its overlap can
    reach; max(g, t) over the whole run assumes one step's slack absorbs another step's excess."""
    g = [row.get("time/generate", 0.0) for row in rows]
    t = [row.get("time/train", 0.0) for row in rows]
    return g[0] + sum(max(t[i], g[i + 1]) for i in range(len(rows) - 1)) + t[-1]


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
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="default: runs/async_longtail (_split with --split-cores)"
    )
    parser.add_argument(
        "--split-cores",
        action="store_true",
        help="both modes with the engine and the trainer rank on cores of their own (see above)",
    )
    parser.add_argument(
        "--rlvr", action="append", default=[], metavar="KEY=VALUE", help="extra config override (both modes)"
    )
    parser.add_argument(
        "--async-rlvr",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config override of the async runs only (e.g. engine.num_threads=1)",
    )
    args = parser.parse_args()
    args.run_dir = args.run_dir or Path("runs/async_longtail" + "_split" * args.split_cores)
    from rich.console import Console

    from rlvr.affinity import allowed_cores
    from rlvr.config import load_config
    from rlvr.demo import ensure_demo_assets

    console = Console()
    log = console.print
    # checkpoint.every = steps: only the final adapter, the one evaluated
    base = bench_overrides(
        WORKLOAD.assets,
        str(args.run_dir),
        args.steps,
        args.prompts,
        args.samples,
        WORKLOAD.max_tokens,
        args.steps,
        [*WORKLOAD.overrides, *args.rlvr],
    )
    build_cfg = load_config(DEMO_CONFIG, base + [f"data.test={WORKLOAD.assets}/task/test.jsonl"])
    ensure_task(build_cfg, WORKLOAD)
    ensure_demo_assets(build_cfg, console)
    cfg = load_config(DEMO_CONFIG, base)
    test_file = held_out_file(cfg, args.held_out, WORKLOAD)

    engine_cpus = max(1, len(allowed_cores()) // 2)
    split = (
        [
            "placement.colocate=false",
            f"placement.engine_cpus={engine_cpus}",
            "engine.num_threads=null",
            "trainer.ranks=1",
        ]
        if args.split_cores
        else []
    )
    modes = {
        "sync": ["rollout.mode=sync", "rollout.max_staleness=0", *split],
        "async": ["rollout.mode=async", f"rollout.max_staleness={args.max_staleness}", *split, *args.async_rlvr],
    }
    steps: dict[str, dict[int, list[dict]]] = {mode: {} for mode in modes}
    for seed in args.seeds:
        for mode, mode_overrides in modes.items():  # the two modes of a seed back to back: the same machine state
            run_dir = args.run_dir / f"{mode}_s{seed}"
            steps[mode][seed] = run([*base, *mode_overrides, f"seed={seed}"], run_dir, log)
    adapters: dict[str, Path | None] = {"base": None} | {
        f"{mode}_s{seed}": args.run_dir / f"{mode}_s{seed}" / "checkpoints" / f"step_{args.steps:06d}" / "adapter"
        for seed in args.seeds
        for mode in modes
    }
    avg8 = {
        name: r["avg@8"]
        for name, r in evaluate_adapters(cfg, test_file, None, adapters, args.run_dir / "eval", log).items()
    }

    def phase(
        mode: str, seed: int, part: str
    ) -> float:  # the last step generates nothing ahead: no time/generate there
        return sum(row.get(f"time/{part}", 0.0) for row in steps[mode][seed])

    per_seed = {}
    for seed in args.seeds:
        seconds = {mode: sum(row["time/step"] for row in steps[mode][seed]) for mode in modes}
        async_rows = steps["async"][seed]
        generate, train = phase("sync", seed, "generate"), phase("sync", seed, "train")
        per_seed[seed] = {
            "sync_s": round(seconds["sync"], 1),
            "async_s": round(seconds["async"], 1),
            "speedup": round(seconds["sync"] / seconds["async"], 3),
            "bound": round((generate + train) / max(generate, train), 3),
            "stepwise_bound": round((generate + train) / stepwise_overlapped_s(steps["sync"][seed]), 3),
            "avg8_sync": avg8[f"sync_s{seed}"],
            "avg8_async": avg8[f"async_s{seed}"],
            "staleness_max": max(row["rollout/staleness_max"] for row in async_rows),
            "staleness_mean": round(statistics.mean(row["rollout/staleness_mean"] for row in async_rows), 3),
            "dropped_stale": int(sum(row["rollout/dropped_stale"] for row in async_rows)),
            **{
                f"{mode}_{part}_s": round(phase(mode, seed, part), 1)
                for mode in modes
                for part in ("generate", "score", "train", "sync", "overlap", "drain")
            },
            "length_p90_sync": statistics.median(row["response/length_p90"] for row in steps["sync"][seed]),
            "length_p90_async": statistics.median(row["response/length_p90"] for row in async_rows),
            # each process's cores as the kernel reported them at the run's end (rlvr's summary.json)
            **{
                f"{mode}_cores": json.loads((args.run_dir / f"{mode}_s{seed}" / "summary.json").read_text()).get(
                    "cores"
                )
                for mode in modes
            },
        }
    total = {mode: sum(per_seed[s][f"{mode}_s"] for s in args.seeds) for mode in modes}
    differences = [per_seed[s]["avg8_async"] - per_seed[s]["avg8_sync"] for s in args.seeds]
    generate, train = (sum(phase("sync", s, part) for s in args.seeds) for part in ("generate", "train"))
    result = {
        "speedup": round(total["sync"] / total["async"], 3),
        "bound": round((generate + train) / max(generate, train), 3),
        "stepwise_bound": round(
            (generate + train) / sum(stepwise_overlapped_s(steps["sync"][s]) for s in args.seeds), 3
        ),
        "sync_generate_s": round(generate, 1),
        "sync_train_s": round(train, 1),
        "avg8_sync": round(statistics.mean(per_seed[s]["avg8_sync"] for s in args.seeds), 4),
        "avg8_async": round(statistics.mean(per_seed[s]["avg8_async"] for s in args.seeds), 4),
        "paired_se": round(paired_se(differences), 4),
        "staleness_max": max(per_seed[s]["staleness_max"] for s in args.seeds),
        "max_staleness": args.max_staleness,
        "dropped_stale": sum(per_seed[s]["dropped_stale"] for s in args.seeds),
        "avg8_base": avg8["base"],
        "trained_groups_per_run": args.steps * args.prompts,
        "seeds": per_seed,
        "settings": {
            "steps": args.steps,
            "prompts": args.prompts,
            "samples": args.samples,
            "max_tokens": WORKLOAD.max_tokens,
            "held_out": args.held_out,
            "extra": args.rlvr,
            "async_extra": args.async_rlvr,
            "split": split,
        },
    } | provenance()
    write_result(args.out, result)
    placement = (
        f", split cores (engine {engine_cpus} of {len(allowed_cores())}, 1 rank on the rest)"
        if args.split_cores
        else ""
    )
    append_line(
        f"async (K={args.max_staleness}) vs sync{placement}, long-tail workload, {len(args.seeds)} seeds x {args.steps} "
        f"steps of {args.prompts}x{args.samples}: **speedup {result['speedup']}** ({total['sync']:.0f} s vs "
        f"{total['async']:.0f} s of steps; bound (g+t)/max(g,t) {result['bound']} from sync's generate {generate:.0f} s + "
        f"train {train:.0f} s; step by step, as the stream overlaps them, {result['stepwise_bound']}); held-out avg@8 sync {result['avg8_sync']} vs async {result['avg8_async']} (base "
        f"{result['avg8_base']}, paired SE {result['paired_se']}); staleness_max {result['staleness_max']}, "
        f"{result['dropped_stale']} groups dropped stale",
        result,
    )


if __name__ == "__main__":
    main()
