"""What an RL step's phases compute, and what this machine can compute: useful FLOPs of a
generate, train and sync phase on a decoder model, and the CPU's matmul peak in a dtype, measured
and nominal. Shared by the benchmarks that report a phase's share of the peak."""

from __future__ import annotations

import os

# FLOP per cycle and core of the widest unit the CPU has for a dtype, by the flag
# torch.cpu.get_capabilities() reports: two FMA ports x lanes x 2 FLOP; AMX's TMUL: a 16x16x32
# bf16 tile product (16,384 FLOP) every 16 cycles. The first unit the CPU has counts.
FLOPS_PER_CYCLE = {
    "float32": (("avx512_f", "AVX-512", 64), ("avx2", "AVX2", 32)),
    "bfloat16": (("amx_bf16", "AMX", 1024), ("avx512_bf16", "AVX512-BF16", 128)),
}


def nominal_peak_flops(dtype: str = "float32") -> tuple[float | None, str]:
    """cores x clock x FLOP per cycle of the CPU's unit for `dtype` (None where it has none) and
    the sum as text. The clock is /proc/cpuinfo's (the base clock under a hypervisor)."""
    import torch

    with open("/proc/cpuinfo") as f:
        mhz = max(float(line.split(":")[1]) for line in f if line.startswith("cpu MHz"))
    cores = len(os.sched_getaffinity(0))
    capabilities = torch.cpu.get_capabilities()
    unit = next(((name, per_cycle) for flag, name, per_cycle in FLOPS_PER_CYCLE[dtype] if capabilities.get(flag)), None)
    if unit is None:
        return None, f"no {dtype} unit among {[name for _, name, _ in FLOPS_PER_CYCLE[dtype]]}"
    name, per_cycle = unit
    peak = cores * mhz * 1e6 * per_cycle
    return (
        peak,
        f"{cores} cores x {mhz / 1e3:.2f} GHz x {per_cycle} {dtype} FLOP/cycle ({name}) = {peak / 1e9:.0f} GFLOP/s",
    )


def matmul_flops_per_s(threads: int, dtype: str = "float32", size: int = 4096) -> float:
    """The best FLOP/s of a size x size torch matmul in `dtype` on `threads` threads: the measured
    peak (rlvr.hardware.matmul_flops, which `rlvr train --dry-run`'s CPU rates come from too)."""
    import torch

    from rlvr.hardware import matmul_flops

    return matmul_flops(getattr(torch, dtype), threads, size, size, size)


def linear_shapes(config) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear of a decoder layer (Llama / Qwen2 layout)."""
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = config.intermediate_size
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def _keys(prompt_lens: list[int], copies: list[int], completion_lens: list[list[int]]) -> int:
    """Keys seen by every query, causally: a prompt's tokens (each copy), and each completion's
    tokens seeing their prompt's keys too."""
    return sum(
        n * p * (p + 1) // 2 + sum(c * p + c * (c + 1) // 2 for c in cs)
        for p, n, cs in zip(prompt_lens, copies, completion_lens)
    )


def train_step_flops(
    config, lora_rank: int, prompt_lens: list[int], completion_lens: list[list[int]], share_prompts: bool
) -> dict[str, float]:
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
    hidden, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    shapes = linear_shapes(config)
    base = sum(i * o for i, o in shapes.values())
    lora = sum(lora_rank * (i + o) for i, o in shapes.values())
    copies = [1 if share_prompts else len(cs) for cs in completion_lens]
    tokens = sum(p * n for p, n in zip(prompt_lens, copies)) + sum(sum(cs) for cs in completion_lens)
    scored = sum(sum(cs) for cs in completion_lens)
    flops = {
        "linear": layers * tokens * (2 + 2) * base,
        "lora": layers * tokens * (2 + 4) * lora,
        "attention": layers * _keys(prompt_lens, copies, completion_lens) * (4 + 8) * heads * head_dim,
        "lm_head": scored * (2 + 2) * config.vocab_size * hidden,
    }
    return flops | {"total": sum(flops.values()), "tokens": tokens, "scored_tokens": scored}


def forward_flops(
    config, prompt_lens: list[int], completion_lens: list[list[int]], lm_head_on: str
) -> dict[str, float]:
    """Useful FLOPs of sampling (or scoring) completions after prompts, each prompt computed once
    (the engine's prefix cache shares it between a prompt's samples): 2·W per token and layer, the
    attention over the keys each token sees (4·heads·head_dim each), and the LM head (2·vocab·hidden)
    on the tokens `lm_head_on` names: "completions" (each sampled or scored token) or "none"."""
    hidden, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    base = sum(i * o for i, o in linear_shapes(config).values())
    completions = sum(sum(cs) for cs in completion_lens)
    tokens = sum(prompt_lens) + completions
    flops = {
        "linear": layers * tokens * 2 * base,
        "attention": layers * _keys(prompt_lens, [1] * len(prompt_lens), completion_lens) * 4 * heads * head_dim,
        "lm_head": (completions if lm_head_on == "completions" else 0) * 2 * config.vocab_size * hidden,
    }
    return flops | {"total": sum(flops.values()), "tokens": tokens, "completion_tokens": completions}


def lora_merge_flops(config, lora_rank: int) -> float:
    """FLOPs of merging a LoRA adapter on every linear into the base: B @ A (2·r·in·out) and the add."""
    return config.num_hidden_layers * sum((2 * lora_rank + 1) * i * o for i, o in linear_shapes(config).values())


def step_shapes(cfg, model_path: str, metrics: list[dict]) -> list[tuple[list[int], list[list[int]]]]:
    """(prompt lengths, completion lengths) of each step: the prompts replayed in the sampler's
    order (checked against each step's data/position), each completion at its step's mean length
    (the loop logs no per-sequence lengths; only the attention term depends on their spread)."""
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
