"""A real model's RL step, stage by stage, and the train step against the machine's fp32 peak.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/real_step.py --out runs/real_step.json

The recipe is configs/smollm2_cpu.yaml as `make smollm2` runs it (docs/real_models.md):
SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49152, tied embeddings) imported from
its Q4_1 GGUF file and quantized to NVFP4, LoRA r16 on every linear layer of the frozen NVFP4
base, one trainer rank, vLLM rollouts, reasoning-gym's chain_sum, 8 prompts x 8 samples of up to
32 tokens. Only the held-out evaluation is left out (data.test=null): this times the RL steps.

Reported: the mean over steps 2..N of each stage (generate, score, train, sync: rlvr's time/*
metrics) and their share of the step; the train step's useful FLOPs (`train_step_flops`, the
formula in its docstring) over time/train, as a fraction of the fp32 peak of the cores the
trainer rank computes on, measured (the best of a few large fp32 matmuls on that many threads)
and nominal (cores x clock x FLOP per cycle of its fp32 unit: benchmarks/_flops.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flops import matmul_flops_per_s, nominal_peak_flops, step_shapes, train_step_flops  # noqa: E402
from _ledger import append_line, provenance, write_result  # noqa: E402

RECIPE = "configs/smollm2_cpu.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=11, help="RL steps; the first warms up and is not counted")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/real_step"))
    parser.add_argument("--rlvr", action="append", default=[], metavar="KEY=VALUE", help="extra rlvr config override")
    parser.add_argument("--note", default="", help="what this run measures, for the ledger line")
    args = parser.parse_args()

    from transformers import AutoConfig

    from rlvr.config import load_config
    from rlvr.orchestration.loop import train

    if (args.run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"{args.run_dir} holds an earlier run; remove it or give another --run-dir")
    overrides = [
        f"run_dir={args.run_dir}",
        f"steps={args.steps}",
        "data.test=null",
        "tracking.progress=false",
        *args.rlvr,
    ]
    cfg = load_config(RECIPE, overrides)
    if not (Path(cfg.model.path) / "config.json").is_file():
        raise SystemExit(
            f"{cfg.model.path} is not built: `make smollm2` (or rlvr import + rlvr quantize, docs/real_models.md)"
        )
    started = time.time()
    train(cfg, log=print)
    metrics = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in metrics if m.get("step", 0) >= 1 and "time/train" in m]
    timed = metrics[1:]

    stages = ("generate", "score", "train", "sync")
    # means, not medians: a sync probe that runs on some steps only counts at its rate
    mean = {k: statistics.mean(m[f"time/{k}"] for m in timed) for k in stages}
    # the run saves its final checkpoint inside the last step; that is not part of an RL step
    step = statistics.mean(m["time/step"] - m.get("time/checkpoint", 0.0) for m in timed)

    config = AutoConfig.from_pretrained(cfg.model.path)
    per_step = [
        train_step_flops(config, cfg.trainer.lora.rank, p, c, cfg.trainer.share_prompts)
        for p, c in step_shapes(cfg, cfg.model.path, metrics)
    ]
    achieved = statistics.median(f["total"] / m["time/train"] for f, m in zip(per_step[1:], timed))
    # the trainer's rule for a rank's threads (rlvr.training.trainer.Trainer): the cores divided among the ranks
    threads = max(1, (os.cpu_count() or 1) // cfg.trainer.ranks)
    measured_peak = matmul_flops_per_s(threads)
    nominal_peak, nominal_text = nominal_peak_flops("float32")
    result = {
        "step_s": step,
        "stages_s": mean,
        "stage_share": {k: v / step for k, v in mean.items()},
        "sync_share": mean["sync"] / step,
        "sync_check_every": cfg.engine.sync_check_every,
        "probed_steps": [m["step"] for m in timed if "sync/logprob_gap" in m],
        "train_flops": statistics.median(f["total"] for f in per_step[1:]),
        "train_flops_parts": {k: statistics.median(f[k] for f in per_step[1:]) for k in per_step[0]},
        "train_flops_per_s": achieved,
        "peak_measured_flops_per_s": measured_peak,
        "peak_measured": f"best of 3 fp32 4096x4096 torch matmuls on {threads} threads (the trainer rank's)",
        "peak_nominal_flops_per_s": nominal_peak,
        "peak_nominal": nominal_text,
        "train_fraction_of_measured_peak": achieved / measured_peak,
        "train_fraction_of_nominal_peak": achieved / nominal_peak,
        "response_length_mean": statistics.mean(m["response/length_mean"] for m in timed),
        "reward_mean": [m["reward/mean"] for m in metrics],
        "sync_logprob_gap_max": max((m["sync/logprob_gap"] for m in metrics if "sync/logprob_gap" in m), default=None),
        "sampler_trainer_gap_max": max(m["sync/sampler_trainer_gap"] for m in metrics),
        "per_step": [{k: v for k, v in m.items() if k.startswith("time/")} for m in metrics],
        "setting": {
            "recipe": RECIPE,
            "steps": args.steps,
            "timed_steps": f"2..{args.steps} (mean)",
            "overrides": overrides,
            "trainer_threads": threads,
        },
        "wall_seconds": round(time.time() - started, 1),
    } | provenance()
    write_result(args.out, result)
    shares = ", ".join(f"{k} {mean[k]:.3f} s ({mean[k] / step:.1%})" for k in stages)
    append_line(
        f"real step, {RECIPE} (SmolLM2-135M-Instruct NVFP4 + LoRA r16, 8 prompts x 8 samples, "
        f"~{result['response_length_mean']:.0f}-token answers, 1 rank){', ' + args.note if args.note else ''}: "
        f"**step {step:.2f} s** (mean of steps 2..{args.steps}): {shares}; **sync {result['sync_share']:.1%} of the "
        f"step** (probed steps: {result['probed_steps'] or 'none'}); train step "
        f"{result['train_flops'] / 1e9:.1f} GFLOP (useful: 4·W·T + 6·LoRA·T + attention + LM head, "
        f"benchmarks/real_step.py) at {achieved / 1e9:.1f} GFLOP/s = **{achieved / measured_peak:.1%} of the "
        f"measured fp32 peak** ({measured_peak / 1e9:.0f} GFLOP/s: {result['peak_measured']}; "
        f"{achieved / nominal_peak:.1%} of nominal {nominal_text})",
        result,
    )


if __name__ == "__main__":
    main()
