"""Each demo from scratch over several seeds: where its warm start stopped and what RL gained.

    python benchmarks/demo_seeds.py --out runs/bench_demo_seeds.json                 # 3 demos x seeds 0 1 2
    python benchmarks/demo_seeds.py --demos tools --seeds 3 --out runs/bench_tools3.json
    python benchmarks/demo_seeds.py --demos moe tools --dtypes auto float32   # the RL phase in each dtype
    python benchmarks/demo_seeds.py --demos demo --backends fsdp2 megatron    # the RL phase on each trainer

Every (demo, seed) is one `rlvr demo --config CONFIG seed=S` with its own assets
(artifacts/NAME_sS: task, model, warm start, all drawn from the seed) and run folder (runs/NAME_sS),
exactly what a user gets from a fresh clone with that seed. With `--dtypes auto float32` each
(demo, seed) also runs its RL phase with `model.dtype=float32` (run folder runs/NAME_sS_float32),
from the same assets, so the two RL phases start from the same warm-started model; `--backends fsdp2
megatron` does the same with `trainer.backend=megatron` (tensor parallel over the demo's 2 ranks, expert
parallel for the MoE demo; run folder runs/NAME_sS_megatron). A pair whose run folder already holds a
summary.json from the same command is read, not rerun (`--fresh` reruns it). Per run it records the
warm start (steps, attempts, the skills at its stop), the held-out avg@k before and after RL and the
wall time; per demo, the range over seeds. Prints the seeds x demos table docs/benchmarks.md keeps,
with the CPU model, and appends a line to the ledger.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _ledger import append_line, provenance, write_result

ROOT = Path(__file__).resolve().parents[1]
DEMOS = {"demo": "configs/demo.yaml", "moe": "configs/demo_moe.yaml", "tools": "configs/demo_tools.yaml"}
TARGETS = {"demo": 0.25, "moe": 0.15, "tools": 0.20}  # the gains each demo promises, in avg@k
# Megatron splits the demo's 2 ranks by tensor parallel, the MoE demo's by expert parallel (MoE + TP needs CUDA)
MEGATRON = {
    "demo": ["trainer.megatron.tensor_parallel=2"],
    "moe": ["trainer.megatron.expert_parallel=2"],
    "tools": ["trainer.megatron.tensor_parallel=2"],
}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def run_name(name: str, seed: int, dtype: str, backend: str = "fsdp2") -> str:
    return f"{name}_s{seed}" + ("" if dtype == "auto" else f"_{dtype}") + ("" if backend == "fsdp2" else f"_{backend}")


def overrides(name: str, seed: int, dtype: str, backend: str = "fsdp2") -> list[str]:
    assets = f"artifacts/{name}_s{seed}"
    return (
        [
            f"seed={seed}",
            f"run_dir=runs/{run_name(name, seed, dtype, backend)}",
            f"model.path={assets}/model",
            f"data.train={assets}/task/train.jsonl",
            f"data.test={assets}/task/test.jsonl",
        ]
        + ([] if dtype == "auto" else [f"model.dtype={dtype}"])
        + ([] if backend == "fsdp2" else [f"trainer.backend={backend}", *MEGATRON[name]])
    )


def run_demo(name: str, seed: int, dtype: str, backend: str, fresh: bool, fresh_assets: bool) -> dict:
    run_dir = ROOT / "runs" / run_name(name, seed, dtype, backend)
    options = overrides(name, seed, dtype, backend)
    command = [sys.executable, "-m", "rlvr.cli", "demo", "--config", DEMOS[name], *options]
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    if fresh_assets:
        shutil.rmtree(ROOT / "artifacts" / f"{name}_s{seed}", ignore_errors=True)
    seconds = None
    if not (run_dir / "summary.json").is_file():
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = round(time.perf_counter() - started, 1)
        if done.returncode != 0:
            raise SystemExit(f"{name} seed {seed} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        (run_dir / "demo.out").write_text(done.stdout)  # what the user's terminal showed
    summary = json.loads((run_dir / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    k = max(int(key.split("@")[1]) for key in after if key.startswith("avg@"))
    warm = summary.get("warm_start") or {}
    return {
        "demo": name,
        "seed": seed,
        "dtype": dtype,
        "backend": backend,
        "compute_dtype": summary.get("compute_dtype"),
        "k": k,
        "avg_before": before[f"avg@{k}"],
        "avg_after": after[f"avg@{k}"],
        "gain_points": round(100 * (after[f"avg@{k}"] - before[f"avg@{k}"]), 1),
        "warm_start_steps": warm.get("steps"),
        "warm_start_attempts": len(warm.get("attempts", [])),
        "warm_start_ready": warm.get("ready"),
        "warm_start_skills": warm.get("skills"),
        "rl_seconds": summary.get("wall_seconds"),
        "wall_seconds": seconds,
        "command": "rlvr demo --config " + DEMOS[name] + " " + " ".join(options),
    }


def table(runs: list[dict], cpu: str) -> str:
    lines = [
        "| demo | seed | trainer | compute | warm start: steps (attempts) | check at its stop | held-out avg@k before → after | gain "
        "| RL phase | CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s = r["warm_start_skills"] or {}
        copies = ", ".join(
            f"{label} {s[key]:.2f}"
            for key, label in (("operand_copy", "operand copy"), ("result_copy", "result copy"))
            if s.get(key) is not None
        )
        check = f"base {s['accuracy']:.3f}" + (f", {copies}" if copies else "") if s else "unchecked"
        lines.append(
            f"| {r['demo']} | {r['seed']} | {r['backend']} | {r['compute_dtype']} | {r['warm_start_steps']} ({r['warm_start_attempts']}) | "
            f"{check} | avg@{r['k']} {r['avg_before']:.3f} → {r['avg_after']:.3f} | {r['gain_points']:+.1f} | "
            f"{r['rl_seconds']} s | {cpu} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demos", nargs="+", choices=sorted(DEMOS), default=["demo", "moe", "tools"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--fresh", action="store_true", help="rebuild assets and rerun pairs that already have a summary"
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=["auto", "float32", "bfloat16"],
        default=["auto"],
        help="model.dtype of the RL phase, each from the same assets; gains are judged on the first",
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=["fsdp2", "megatron"],
        default=["fsdp2"],
        help="trainer.backend of the RL phase, each from the same assets",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench_demo_seeds.json"))
    args = parser.parse_args()

    cpu = cpu_model()
    variants = [(dtype, backend) for backend in args.backends for dtype in args.dtypes]  # the first judges gains
    runs = [
        run_demo(name, seed, dtype, backend, args.fresh, args.fresh and (dtype, backend) == variants[0])
        for name in args.demos
        for seed in args.seeds
        for dtype, backend in variants
    ]
    per_demo = {}
    for name in args.demos:
        per_demo[name] = {"target_points": 100 * TARGETS[name]}
        for dtype, backend in variants:
            gains = [r["gain_points"] for r in runs if (r["demo"], r["dtype"], r["backend"]) == (name, dtype, backend)]
            per_demo[name][f"{backend} {dtype}"] = {
                "gains": gains,
                "gain_mean": round(sum(gains) / len(gains), 1),
                "all_meet_target": all(g >= 100 * TARGETS[name] for g in gains),
            }
        # each later variant's RL phase over the first's, seed by seed
        per_demo[name]["rl_seconds_over_first"] = {
            f"{backend} {dtype}": [
                round(other["rl_seconds"] / first["rl_seconds"], 2)
                for first in runs
                if (first["demo"], first["dtype"], first["backend"]) == (name, *variants[0])
                for other in runs
                if (other["demo"], other["seed"], other["dtype"], other["backend"])
                == (name, first["seed"], dtype, backend)
            ]
            for dtype, backend in variants[1:]
        }
    result = {"cpu": cpu, "runs": runs, "per_demo": per_demo, "table": table(runs, cpu)} | provenance()
    write_result(args.out, result)
    print(result["table"])
    what = "; ".join(
        f"{name} over seeds {args.seeds} (target {d['target_points']:+.0f}): "
        + ", ".join(
            f"{backend} {dtype} gains {' '.join(f'{g:+.1f}' for g in d[f'{backend} {dtype}']['gains'])} "
            f"(mean {d[f'{backend} {dtype}']['gain_mean']:+.1f}; {'all met' if d[f'{backend} {dtype}']['all_meet_target'] else 'NOT all met'})"
            for dtype, backend in variants
        )
        + "".join(f", RL phase {variant}/first {ratios}" for variant, ratios in d["rl_seconds_over_first"].items())
        for name, d in per_demo.items()
    )
    append_line(f"demos from scratch over seeds, {cpu}: {what}", result)


if __name__ == "__main__":
    main()
