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
and nominal (cores x clock x 32 FLOP per cycle).
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

from _ledger import append_line, provenance, write_result  # noqa: E402
from generation import fp32_peak_flops  # noqa: E402

RECIPE = "configs/smollm2_cpu.yaml"
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def train_step_flops(config, lora_rank: int, prompt_lens: list[int], completion_lens: list[list[int]],
                     share_prompts: bool) -> dict[str, float]:
    """Useful FLOPs of one LoRA train step (one update, no pi_old forward) on a frozen base.

    T tokens go through the model: each group's prompt once when its samples share it
    (trainer.share_prompts), else once per sample, plus every completion. Per token and decoder
    layer, with W the weights of the layer's 7 linears and r(in + out) the LoRA weights of each:
      forward   2·W + 2·r(in + out) per adapted linear;
      backward  2·W (input gradients only: the base is frozen, so no weight gradients)
                + 4·r(in + out) (the LoRA input and weight gradients).
    So 4·W·T for the base, where full fine-tuning would be 6·W·T. Attention, per query seeing k
    keys (causal; a completion sees its prompt's keys too): 4·heads·head_dim·k forward (QK^T and
    AV), twice that backward. The tied, frozen LM head runs on the S scored (completion) tokens
    only: 2·vocab·hidden forward and the same backward (input gradients). Left out, as model-FLOPs
    utilisation leaves them out: norms, activations, softmax (elementwise), the NVFP4
    dequantization of each packed weight, and what is computed twice (the LM head re-run under
    its activation checkpointing).
    """
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = config.intermediate_size
    shapes = {  # (in, out) of each linear of a decoder layer
        "q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden),
    }
    base = sum(i * o for i, o in shapes.values())
    lora = sum(lora_rank * (i + o) for i, o in shapes.values())
    copies = [1 if share_prompts else len(cs) for cs in completion_lens]
    tokens = sum(p * n for p, n in zip(prompt_lens, copies)) + sum(sum(cs) for cs in completion_lens)
    scored = sum(sum(cs) for cs in completion_lens)
    keys = sum(n * p * (p + 1) // 2 + sum(c * p + c * (c + 1) // 2 for c in cs)
               for p, n, cs in zip(prompt_lens, copies, completion_lens))
    flops = {
        "linear": layers * tokens * (2 + 2) * base,
        "lora": layers * tokens * (2 + 4) * lora,
        "attention": layers * keys * (4 + 8) * heads * head_dim,
        "lm_head": scored * (2 + 2) * config.vocab_size * hidden,
    }
    return flops | {"total": sum(flops.values()), "tokens": tokens, "scored_tokens": scored}


def matmul_flops_per_s(threads: int, size: int = 4096, repeats: int = 3) -> float:
    """The best FLOP/s of a size x size fp32 torch matmul on `threads` threads: the measured peak."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return 2 * size**3 / best


def step_shapes(cfg, model_path: str, metrics: list[dict]) -> list[tuple[list[int], list[list[int]]]]:
    """(prompt lengths, completion lengths) of each step: the prompts replayed in the sampler's
    order (checked against each step's data/position), each completion at its step's mean length
    (the loop logs no per-sequence lengths; only the attention term, ~1% here, depends on the spread)."""
    from transformers import AutoTokenizer

    from rlvr.rollout.prompts import load_prompt_set
    from rlvr.rollout.sampler import EpochSampler

    prompts = load_prompt_set(cfg.data, cfg.data.train, AutoTokenizer.from_pretrained(model_path)).prompts
    sampler, shapes = EpochSampler(len(prompts), cfg.seed), []
    for m in metrics:
        chosen = sampler.take(cfg.rollout.prompts_per_step)
        if sampler.position != m["data/position"]:
            raise SystemExit(f"the sampler replay is at {sampler.position}, the run at {m['data/position']}")
        mean = m["response/length_mean"]
        shapes.append(([len(prompts[i]) for i in chosen], [[mean] * cfg.rollout.samples_per_prompt for _ in chosen]))
    return shapes


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
    overrides = [f"run_dir={args.run_dir}", f"steps={args.steps}", "data.test=null", "tracking.progress=false", *args.rlvr]
    cfg = load_config(RECIPE, overrides)
    if not (Path(cfg.model.path) / "config.json").is_file():
        raise SystemExit(f"{cfg.model.path} is not built: `make smollm2` (or rlvr import + rlvr quantize, docs/real_models.md)")
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
    per_step = [train_step_flops(config, cfg.trainer.lora.rank, p, c, cfg.trainer.share_prompts)
                for p, c in step_shapes(cfg, cfg.model.path, metrics)]
    achieved = statistics.median(f["total"] / m["time/train"] for f, m in zip(per_step[1:], timed))
    # the trainer's rule for a rank's threads (rlvr.training.trainer.Trainer): the cores divided among the ranks
    threads = max(1, (os.cpu_count() or 1) // cfg.trainer.ranks)
    measured_peak = matmul_flops_per_s(threads)
    nominal_peak, nominal_text = fp32_peak_flops()
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
        "setting": {"recipe": RECIPE, "steps": args.steps, "timed_steps": f"2..{args.steps} (mean)",
                    "overrides": overrides, "trainer_threads": threads},
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
