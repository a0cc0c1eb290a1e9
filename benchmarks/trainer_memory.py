"""Trainer memory: a bf16 base vs an NVFP4-packed base, same ~20M-parameter model, LoRA on top.

    .venv/bin/python benchmarks/trainer_memory.py --out trainer_memory.json
    .venv/bin/python benchmarks/trainer_memory.py --arch deepseek_v3 --out trainer_memory_moe.json

`--arch` picks the tiny architecture (rlvr.models.tiny): `qwen2` (dense, the default) or an MoE
one (`deepseek_v3`: MLA, layer 0 dense, 8 routed + 1 shared expert per later layer;
`qwen3_moe`, `mixtral`), whose routed experts stay packed in the trainer.

Writes `{"bf16_weight_bytes", "nvfp4_weight_bytes", "ratio", "peak_rss_bf16", "peak_rss_nvfp4",
"tokens_per_s", "nvfp4_local_bytes_1rank", "nvfp4_local_bytes_per_rank_2ranks",
"nvfp4_local_bytes_ratio_2ranks"}` plus a few keys that say what was measured, and appends a line to
docs/benchmarks.md.

- weight bytes: the bytes of every tensor in the model's checkpoint, each stored tensor once:
  the tied embedding / lm_head counts once on both sides (bf16 on both: it is not quantized),
  so do norms and biases; the NVFP4 side counts packed values, FP8 group scales and FP32
  global scales.
- peak RSS: the peak resident set (VmHWM) of a fresh subprocess per variant that imports the
  stack, loads the model, wraps it in LoRA (r=16, all linear layers) and runs a few AdamW steps forward and
  backward, with `MALLOC_MMAP_THRESHOLD_=65536` so that freed large blocks go back to the OS.
  It includes the interpreter and libraries (`rss_after_imports` says how much).
- tokens_per_s: LoRA training tokens per second on the NVFP4 base (after one warm-up step).
- nvfp4_local_bytes_1rank / nvfp4_local_bytes_2ranks / nvfp4_local_bytes_per_rank_2ranks /
  nvfp4_local_bytes_ratio_2ranks: the bytes of packed base (packed values, FP8 group scales,
  biases and global scales of the quantized Linears and experts, `rlvr.quant.experts.packed_base_bytes`)
  each FSDP2 rank (gloo, built as the trainer's ranks build their policy: `Skeleton`, LoRA,
  `TokenLogprobs`, `shard_and_load`) holds after one forward and backward, with 1 rank and with 2 (each,
  and the larger); FSDP2 shards it, so 2 ranks hold about half each (plus FSDP2's padding and
  the replicated global scales); the experts are sharded by expert.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _ledger import append_line, provenance, write_result
from _proc import status_bytes

# ~20.5M parameters: 7 blocks of 512 wide, 8 heads (2 KV heads), MLP 1536, tied embedding; the
# MoE architectures take the same sizes (DeepSeek-V3: experts of 1536 / 4 = 384, MLA ranks 256)
MODEL_SIZES = dict(hidden_size=512, num_layers=7, num_heads=8, num_kv_heads=2, intermediate_size=1536)


def checkpoint_bytes(model_dir: Path) -> int:
    """Bytes of all tensors stored in the folder's safetensors files (a tied tensor is stored once)."""
    from safetensors.torch import load_file

    return sum(
        t.numel() * t.element_size() for path in model_dir.glob("*.safetensors") for t in load_file(path).values()
    )


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM, benchmarks/_proc.py says why not ru_maxrss)."""
    return status_bytes()["VmHWM"]


def train_in_this_process(variant: str, model_dir: str, dtype_name: str, steps: int, batch: int, seq_len: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.quant import load_quantized_model
    from rlvr.training.policy import apply_lora

    rss_after_imports = peak_rss_bytes()
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    if variant == "nvfp4":
        model = load_quantized_model(model_dir, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = apply_lora(model, rank=16, alpha=32.0, dropout=0.0, target_modules="all-linear")
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(4, model.config.vocab_size, (batch, seq_len))

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()  # warm-up: first-call allocations and kernel selection
    start = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = time.perf_counter() - start
    return {
        "peak_rss": peak_rss_bytes(),
        "rss_after_imports": rss_after_imports,
        "tokens_per_s": steps * batch * seq_len / elapsed,
    }


def packed_base_bytes_per_rank(model_dir: Path, ranks: int, dtype_name: str, batch: int, seq_len: int) -> list[int]:
    """Bytes of packed base (Linears and experts) each trainer rank holds after one LoRA train step."""
    import torch

    from rlvr.config import AlgorithmConfig, LoraConfig, TrainerConfig
    from rlvr.models.folder import read_model_folder
    from rlvr.records import TrainBatch
    from rlvr.training.trainer import Trainer
    from rlvr.training.worker import RankSpec

    generator = torch.Generator().manual_seed(0)
    half = seq_len // 2
    sequences = [torch.randint(4, 200, (seq_len,), generator=generator).tolist() for _ in range(batch)]
    train_batch = TrainBatch(
        prompt_ids=[s[:half] for s in sequences],
        completion_ids=[s[half:] for s in sequences],
        sampler_logprobs=[[-1.0] * (seq_len - half) for _ in sequences],
        advantages=torch.linspace(-1.0, 1.0, batch),
        group=torch.zeros(batch, dtype=torch.long),
    )
    trainer_cfg = TrainerConfig(
        ranks=ranks, lora=LoraConfig(rank=16, alpha=32.0, dropout=0.0, target_modules="all-linear")
    )
    spec = RankSpec(
        folder=read_model_folder(model_dir),
        dtype=dtype_name,
        trainer=trainer_cfg,
        algorithm=AlgorithmConfig(),
        seed=0,
        total_steps=1,
    )
    with Trainer(spec) as trainer:
        trainer.train_step(train_batch)
        return trainer.packed_base_bytes()


def run_variant(variant: str, model_dir: Path, args) -> dict:
    command = [
        sys.executable, __file__, "--child", variant, str(model_dir), "--dtype", args.dtype,
        "--steps", str(args.steps), "--batch", str(args.batch), "--seq-len", str(args.seq_len),
    ]  # fmt: skip
    # glibc otherwise keeps freed large blocks (the per-layer dequantized weights, activations)
    # in its heap once its adaptive mmap threshold has grown, and RSS then measures the
    # allocator's history, not live memory; the same fixed threshold applies to both variants
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{variant} run failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument(
        "--arch", default="qwen2", help="tiny architecture: qwen2 (dense), deepseek_v3, qwen3_moe, mixtral"
    )
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype of both variants")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(train_in_this_process(*args.child, args.dtype, args.steps, args.batch, args.seq_len)))
        return
    if args.out is None:
        parser.error("--out is required")

    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.models.params import count_parameters
    from rlvr.models.tiny import build_tiny_model
    from rlvr.quant import quantize_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        float_dir = build_tiny_model(tmp / "fp32", args.arch, **MODEL_SIZES)
        # the bf16 baseline is stored in bf16, so that loading it touches bf16 bytes only
        model = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.bfloat16)
        counts = count_parameters(model)
        parameters, active = counts.total, counts.active
        bf16_dir = tmp / "bf16"
        model.save_pretrained(bf16_dir)
        for path in float_dir.iterdir():
            if path.name.startswith(("tokenizer", "chat_template", "special_tokens")):
                (bf16_dir / path.name).write_bytes(path.read_bytes())
        del model
        nvfp4_dir = quantize_checkpoint(bf16_dir, tmp / "nvfp4")

        bf16_bytes, nvfp4_bytes = checkpoint_bytes(bf16_dir), checkpoint_bytes(nvfp4_dir)
        bf16_run, nvfp4_run = run_variant("bf16", bf16_dir, args), run_variant("nvfp4", nvfp4_dir, args)
        (local_1rank,) = packed_base_bytes_per_rank(nvfp4_dir, 1, args.dtype, args.batch, args.seq_len)
        local_2ranks = packed_base_bytes_per_rank(nvfp4_dir, 2, args.dtype, args.batch, args.seq_len)

    report = {
        "arch": args.arch,
        "bf16_weight_bytes": bf16_bytes,
        "nvfp4_weight_bytes": nvfp4_bytes,
        "ratio": nvfp4_bytes / bf16_bytes,
        "peak_rss_bf16": bf16_run["peak_rss"],
        "peak_rss_nvfp4": nvfp4_run["peak_rss"],
        "tokens_per_s": nvfp4_run["tokens_per_s"],
        "tokens_per_s_bf16": bf16_run["tokens_per_s"],
        "nvfp4_local_bytes_1rank": local_1rank,
        "nvfp4_local_bytes_2ranks": local_2ranks,
        "nvfp4_local_bytes_per_rank_2ranks": max(local_2ranks),
        "nvfp4_local_bytes_ratio_2ranks": max(local_2ranks) / local_1rank,
        "rss_after_imports": min(bf16_run["rss_after_imports"], nvfp4_run["rss_after_imports"]),
        "parameters": parameters,
        "active_parameters": active,
        "compute_dtype": args.dtype,
        "train_shape": {"steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "lora_rank": 16},
    }
    report |= provenance()
    write_result(args.out, report)
    append_line(
        f"trainer memory, {args.arch} ({parameters / 1e6:.1f}M parameters, {active / 1e6:.1f}M active), bf16 vs NVFP4 base, "
        f"LoRA r=16 all-linear, {args.dtype} compute: weights **{bf16_bytes:,} B bf16 vs {nvfp4_bytes:,} B nvfp4, ratio "
        f"{report['ratio']:.3f}**; packed base per FSDP2 rank after a train step: 1 rank {local_1rank:,} B, 2 ranks "
        f"{max(local_2ranks):,} B each (**ratio {report['nvfp4_local_bytes_ratio_2ranks']:.4f}**); peak RSS "
        f"{bf16_run['peak_rss'] / 1e6:.1f} MB bf16 vs {nvfp4_run['peak_rss'] / 1e6:.1f} MB nvfp4 "
        f"({report['rss_after_imports'] / 1e6:.1f} MB after imports); {nvfp4_run['tokens_per_s']:.1f} tokens/s nvfp4 LoRA "
        f"training (bf16 base: {bf16_run['tokens_per_s']:.1f})",
        report,
    )


if __name__ == "__main__":
    main()
