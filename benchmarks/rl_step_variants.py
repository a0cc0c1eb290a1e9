"""The RL step's variants on the demo, side by side over seeds: what each does to learning.

    python benchmarks/rl_step_variants.py --out runs/bench_variants.json                      # mini-batches 1 vs 4
    python benchmarks/rl_step_variants.py --variants base:,dynamic:rollout.dynamic_sampling=true \\
        --eval-every 10 --seeds 0 --out runs/bench_dynamic.json                                 # learning curves

Each variant is `name:override[;override...]` (config overrides as `rlvr train` takes them).
For every seed, the demo's assets (task split and warm start, both drawn from the seed) are built
once and every variant trains from them: the variants of one seed differ only by their overrides,
and the runs alternate variant by variant so that a load change hits them alike. Each run is a
fresh `rlvr train configs/demo.yaml` process (80 steps, as `make demo`).

Per run it records the held-out avg@8 before and after RL (and at every `--eval-every` steps),
the fraction of steps with a non-zero `policy/clip_fraction`, the mean `optimizer/steps` per RL
step, the mean `rollout/informative_groups` and the run's wall time. Per variant: the mean and
standard error over seeds of the final avg@8. Appends a line to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
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
AVG8 = re.compile(r"^eval/(.+/)?avg@8$")


def seed_config(work: Path, seed: int, eval_every: int) -> Path:
    """The demo's config for one seed, its assets under work/seedS (built here, once)."""
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    assets = work / f"seed{seed}" / "assets"
    cfg.update(seed=seed)
    cfg["model"]["path"] = str(assets / "model")
    cfg["data"].update(train=str(assets / "task" / "train.jsonl"), test=str(assets / "task" / "test.jsonl"))
    cfg["eval"]["every"] = eval_every
    cfg["checkpoint"]["every"] = 0
    cfg["tracking"] = {"progress": False}
    path = work / f"seed{seed}" / "demo.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    ensure_demo_assets(load_config(path), Console(quiet=True))
    return path


def run_variant(config: Path, run_dir: Path, overrides: list[str]) -> dict:
    started = time.perf_counter()
    command = [sys.executable, "-m", "rlvr.cli", "train", str(config), f"run_dir={run_dir}", *overrides]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [r for r in rows if "reward/mean" in r]
    # before and every eval.every steps in metrics.jsonl; the final evaluation in summary.json
    curve = {r["step"]: v for r in rows for k, v in r.items() if AVG8.match(k)} | {
        len(steps): summary["eval_after"]["avg@8"]
    }
    return {
        "avg8_curve": curve,
        "avg8_before": summary["eval_before"]["avg@8"],
        "avg8_after": summary["eval_after"]["avg@8"],
        "clip_nonzero_fraction": sum(r.get("policy/clip_fraction", 0.0) > 0 for r in steps) / len(steps),
        "optimizer_steps_mean": statistics.mean(r.get("optimizer/steps", 1.0) for r in steps),
        "informative_groups_mean": statistics.mean(r.get("rollout/informative_groups", 0) for r in steps),
        "reward_curve": {r["step"]: r["reward/mean"] for r in steps},
        "seconds": round(time.perf_counter() - started, 1),
    }


def summarise(runs: list[dict]) -> dict:
    after = [r["avg8_after"] for r in runs]
    stderr = statistics.stdev(after) / len(after) ** 0.5 if len(after) > 1 else None
    return {
        "avg8_after_mean": round(statistics.mean(after), 4),
        "avg8_after_stderr": None if stderr is None else round(stderr, 4),
        "avg8_gain_mean": round(statistics.mean(r["avg8_after"] - r["avg8_before"] for r in runs), 4),
        "clip_nonzero_fraction_mean": round(statistics.mean(r["clip_nonzero_fraction"] for r in runs), 3),
        "optimizer_steps_mean": round(statistics.mean(r["optimizer_steps_mean"] for r in runs), 2),
        "informative_groups_mean": round(statistics.mean(r["informative_groups_mean"] for r in runs), 2),
        "seconds_mean": round(statistics.mean(r["seconds"] for r in runs), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    parser.add_argument(
        "--variants",
        default="minibatch1:trainer.mini_batches=1,minibatch4:trainer.mini_batches=4",
        help="name:override[;override...], comma separated",
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--eval-every", type=int, default=0, help="held-out evaluation every N steps (0: before and after)"
    )
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_variants")
    args = parser.parse_args()

    variants = {}
    for item in args.variants.split(","):
        name, _, overrides = item.partition(":")
        variants[name] = [o for o in overrides.split(";") if o]
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for seed in seeds:
        config = seed_config(args.work, seed, args.eval_every)
        for name, overrides in variants.items():
            run = run_variant(config, args.work / f"seed{seed}" / name, overrides) | {"seed": seed}
            runs[name].append(run)
            print(
                f"seed {seed} {name}: avg@8 {run['avg8_before']:.3f} -> {run['avg8_after']:.3f}, "
                f"clip>0 on {run['clip_nonzero_fraction']:.0%} of steps, {run['seconds']:.0f} s",
                flush=True,
            )

    summary = {name: summarise(rs) for name, rs in runs.items()}
    # Seeds differ in their task split and warm start, so the spread between seeds dwarfs the
    # variants' difference: compare each variant with the first on the same seed.
    first = next(iter(runs))
    paired = {}
    for name in list(runs)[1:]:
        gaps = [b["avg8_after"] - a["avg8_after"] for a, b in zip(runs[first], runs[name])]
        stderr = statistics.stdev(gaps) / len(gaps) ** 0.5 if len(gaps) > 1 else None
        paired[f"{name} - {first}"] = {
            "per_seed": [round(g, 4) for g in gaps],
            "mean": round(statistics.mean(gaps), 4),
            "stderr": None if stderr is None else round(stderr, 4),
        }
    result = {"variants": variants, "seeds": seeds, "summary": summary, "paired": paired, "runs": runs} | provenance()
    write_result(args.out, result)
    figures = "; ".join(
        f"{name} ({' '.join(variants[name]) or 'demo as is'}): avg@8 after {s['avg8_after_mean']}"
        + (f" ± {s['avg8_after_stderr']}" if s["avg8_after_stderr"] is not None else "")
        + f" (gain {s['avg8_gain_mean']:+}), clip>0 on {s['clip_nonzero_fraction_mean']:.0%} of steps, "
        f"{s['optimizer_steps_mean']} optimizer steps/RL step, {s['informative_groups_mean']} informative groups, {s['seconds_mean']} s"
        for name, s in summary.items()
    )
    differences = "; ".join(
        f"**{pair}: {d['mean']:+}**"
        + (f" ± {d['stderr']}" if d["stderr"] is not None else "")
        + f" (per seed {d['per_seed']})"
        for pair, d in paired.items()
    )
    append_line(
        f"demo, RL step variants over seeds {args.seeds} (held-out avg@8 after 80 steps, mean ± s.e.): {figures}; "
        f"paired difference of avg@8 after: {differences}",
        result,
    )


if __name__ == "__main__":
    main()
