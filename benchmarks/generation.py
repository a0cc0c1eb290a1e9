"""Generation throughput: the vLLM engine against batched transformers `generate`, one run.

    .venv/bin/python benchmarks/generation.py --out runs/bench_generation.json

Builds a ~9M-parameter Qwen2 (random weights, char tokenizer), then on 64 prompts x 8 samples:
  fixed     every sample exactly 128 new tokens (pure decoding efficiency);
  variable  each sample's length drawn once (seeded) from a long-tailed law on [8, 512]:
            vLLM stops each sample at its own length, HF runs each batch to its longest row.
Only each sample's own tokens count. EOS is ignored so lengths are exactly the drawn ones.
Also measures the in-memory LoRA sync (rank 16 on every linear layer) and vLLM's fixed-workload
model FLOP/s as a fraction of the machine's nominal fp32 peak (cores x clock x FLOP per cycle of
its widest fp32 unit: benchmarks/_flops.py).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from _flops import nominal_peak_flops
from safetensors.torch import load_file

from rlvr.config import EngineConfig, ModelConfig
from rlvr.engines import make_engine
from rlvr.models.folder import read_model_folder
from rlvr.models.tiny import build_tiny_model
from rlvr.records import LoraAdapter, Sampling

PROMPTS, SAMPLES, FIXED_TOKENS = 64, 8, 128
MIN_TOKENS, MAX_TOKENS = 8, 512
MODEL_SIZES = dict(hidden_size=256, num_layers=8, num_heads=4, num_kv_heads=2, intermediate_size=1024)


def variable_lengths(count: int, seed: int) -> list[int]:
    """Long-tailed lengths: log-length = u^2 over [log 8, log 512], u uniform (median ~64, ~9% above 256)."""
    rng = random.Random(seed)
    return [round(MIN_TOKENS * (MAX_TOKENS / MIN_TOKENS) ** (rng.random() ** 2)) for _ in range(count)]


def prompts_for(tokenizer) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Problem {i}: what is {i} + {i * 7 % 13}?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(PROMPTS)
    ]


def tokens_per_s(engine, prompts: list[list[int]], lengths: list[int] | None) -> float:
    """Throughput counting each sample's own tokens; `lengths` gives one length per sample (or fixed)."""
    if lengths is None:
        rows, n = prompts, SAMPLES
        samplings = Sampling(temperature=1.0, max_tokens=FIXED_TOKENS, seed=0)
    else:  # one row per sample, so that each sample carries its own max_tokens
        rows, n = [p for p in prompts for _ in range(SAMPLES)], 1
        samplings = [Sampling(temperature=1.0, max_tokens=m, seed=0) for m in lengths]
    start = time.perf_counter()
    rollouts = engine.generate(rows, n, samplings, ignore_eos=True)
    elapsed = time.perf_counter() - start
    expected = FIXED_TOKENS * len(rollouts) if lengths is None else sum(lengths)
    produced = sum(len(r.completion_ids) for r in rollouts)
    if produced != expected:
        raise RuntimeError(f"{type(engine).__name__} produced {produced} tokens, expected {expected}")
    return produced / elapsed


def lora_adapter(model_dir: Path, version: int) -> LoraAdapter:
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    config = LoraConfig(
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), config)
    return LoraAdapter(get_peft_model_state_dict(model), config.to_dict(), version)


def flops_per_token(config, params: int, mean_context: float) -> float:
    """2 x matmul weights (the tied embedding counted once, as the LM head) + attention over the context."""
    attention = (
        4
        * config.num_hidden_layers
        * config.num_attention_heads
        * (config.hidden_size // config.num_attention_heads)
        * mean_context
    )
    return 2 * params + attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--vllm-threads", type=int, default=None, help="CPU threads for vLLM (default: the engine's, half the cores)"
    )
    parser.add_argument("--hf-batch-size", type=int, default=128, help="rows per HF generate call")
    args = parser.parse_args()

    from transformers import AutoConfig, AutoTokenizer

    model_dir = build_tiny_model(
        Path(tempfile.mkdtemp(prefix="rlvr-bench-")) / "model", "qwen2", seed=args.seed, **MODEL_SIZES
    )
    config = AutoConfig.from_pretrained(model_dir)
    params = sum(t.numel() for t in load_file(model_dir / "model.safetensors").values())
    prompts = prompts_for(AutoTokenizer.from_pretrained(model_dir))
    lengths = variable_lengths(PROMPTS * SAMPLES, args.seed)

    results: dict = {"fixed": {}, "variable": {}}
    # Throughput without LoRA (vLLM's CPU LoRA kernels cost extra per layer, and the demo
    # rollouts are measured on the base model); the LoRA sync is timed on its own engine.
    model = ModelConfig(path=str(model_dir))
    folder = read_model_folder(model.path)
    with make_engine(
        folder,
        EngineConfig(max_model_len=1024, kv_cache_gb=2, max_num_seqs=PROMPTS * SAMPLES, num_threads=args.vllm_threads),
        dtype=model.dtype,
        seed=args.seed,
    ) as vllm:
        tokens_per_s(vllm, prompts[:8], None)  # warm-up: first-call allocations
        results["fixed"]["vllm_tokens_per_s"] = tokens_per_s(vllm, prompts, None)
        print("vllm fixed", results["fixed"], flush=True)
        results["variable"]["vllm_tokens_per_s"] = tokens_per_s(vllm, prompts, lengths)
    with make_engine(
        folder, EngineConfig(max_model_len=256, kv_cache_gb=1), dtype=model.dtype, seed=args.seed, lora_rank=16
    ) as vllm:
        syncs = []
        for version in range(1, 6):
            adapter = lora_adapter(model_dir, version)
            start = time.perf_counter()
            vllm.update_lora(adapter)
            syncs.append((time.perf_counter() - start) * 1e3)
        results["lora_sync_ms"] = sorted(syncs)[len(syncs) // 2]
    hf = make_engine(
        folder, EngineConfig(backend="hf", hf_batch_size=args.hf_batch_size), dtype=model.dtype, seed=args.seed
    )
    with hf:
        results["fixed"]["hf_tokens_per_s"] = tokens_per_s(hf, prompts, None)
        print("hf fixed", results["fixed"], flush=True)
        results["variable"]["hf_tokens_per_s"] = tokens_per_s(hf, prompts, lengths)
    for workload in ("fixed", "variable"):
        w = results[workload]
        w["ratio"] = w["vllm_tokens_per_s"] / w["hf_tokens_per_s"]
    peak, peak_text = nominal_peak_flops("float32")
    mean_context = len(prompts[0]) + FIXED_TOKENS / 2
    results["params"] = params
    results["fraction_of_peak_flops"] = (
        results["fixed"]["vllm_tokens_per_s"] * flops_per_token(config, params, mean_context) / peak
    )
    ordered = {k: results[k] for k in ("fixed", "variable", "lora_sync_ms", "params", "fraction_of_peak_flops")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(ordered, indent=2) + "\n")
    print(json.dumps(ordered, indent=2))
    print(f"fp32 peak: {peak_text}; variable lengths: mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)}")


if __name__ == "__main__":
    main()
