"""Host memory of a trainer rank loading a DeepSeek-V3-shaped NVFP4 checkpoint sharded, at 1, 2 and 4 ranks.

    .venv/bin/python benchmarks/load_memory.py --out runs/bench/load_memory.json

The checkpoint (written once to `--checkpoint`, default artifacts/load_memory_nvfp4): transformers'
DeepseekV3 (MLA, a dense first layer, then MoE layers of 96 routed experts + 1 shared), every
Linear and expert projection NVFP4 as `quantize_checkpoint` lays it out (one Linear per expert
projection, compressed-tensors names), the routers, norms and embeddings float32, in shard files
of ~256 MB. The values are random (uniform packed bytes, FP8 group scales around 1): this measures
bytes, not a trained model. Over 1 GB on disk.

For each N, the real trainer (`rlvr.training.trainer.Trainer`, N local rank processes, one thread
each) loads it, computes the logprobs of a fixed batch, and takes one LoRA train step. Each rank
process samples its private memory (RssAnon, /proc/self/status) every 2 ms from just after its
imports (the baseline) to its exit, and reports each new peak with its time, so that the peak
while loading (until every rank is up) and over the whole run are both read off. The target:
the load's peak <= 1.2 x S / N + one block, S the checkpoint's tensor bytes and a
block the largest decoder block's tensors. The loader before sharded loading held all of S in
every rank (it read every tensor, then sharded). Logprobs must be equal across N (bit for bit:
one thread per rank).

The step's own peak is reported too, and it is not bounded by S / N: every rank runs every layer
with its experts gathered, whatever N, and on CPU a rank keeps the heap a step grew
(`rlvr.training.rank_host.keep_freed_memory`); per-expert dequantized weights freed between small
tensors saved for backward leave holes the next weight does not fit (with glibc's mmap threshold
fixed at 64 KiB the same forward and backward add ~0.14 GB instead of ~3.5 GB). On a GPU the
activations live on the device and the host holds the load's peak.

Writes JSON and appends a line to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

# imported before the baseline: a rank's load is measured, not the libraries it loads
import peft  # noqa: F401
import safetensors  # noqa: F401
import torch
import transformers  # noqa: F401
from _proc import status_bytes

from rlvr.quant.skeleton import Skeleton  # noqa: F401
from rlvr.training.rank_host import run_rank
from rlvr.training.trainer import RankProcess, Trainer, free_port

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(
    hidden_size=1024,
    num_hidden_layers=10,
    intermediate_size=2048,
    num_attention_heads=8,
    num_key_value_heads=8,
    vocab_size=8192,
    q_lora_rank=384,
    kv_lora_rank=256,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
    n_routed_experts=96,
    num_experts_per_tok=4,
    moe_intermediate_size=768,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    tie_word_embeddings=False,
)
SHARD_BYTES = 256 << 20
SAMPLE_S = 0.002


def _rss_anon() -> int:
    return status_bytes()["RssAnon"]


def measured_rank(rank: int, world_size: int, port: int, spec, conn, report: str) -> None:
    """`run_rank`, with this process's private memory sampled from here (after imports) to its end."""
    baseline, peaks, done = _rss_anon(), [(time.monotonic(), 0)], threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = _rss_anon()
            if now > peaks[-1][1]:
                peaks.append((time.monotonic(), now))  # the monotonic clock is the machine's: the parent's too
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run_rank(rank, world_size, port, spec, conn)
    finally:
        done.set()
        sampler.join()
        Path(report).write_text(json.dumps({"baseline": baseline, "peaks": peaks}))


class MeasuredRankProcess(RankProcess):
    def __init__(self, context, rank, world_size, port, spec, report: Path):
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=measured_rank, args=(rank, world_size, port, spec, child, str(report)), daemon=True
        )
        self._process.start()
        child.close()


def write_checkpoint(out: Path) -> Path:
    """A random NVFP4 checkpoint of SHAPE, laid out as `quantize_checkpoint` writes one."""
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    from rlvr.models.hub_layout import disk_name, expert_pieces
    from rlvr.models.moe import expert_projections, moe_layers
    from rlvr.quant.formats import nvfp4_quantization_config
    from rlvr.quant.nvfp4 import GROUP_SIZE

    if (out / "config.json").is_file():
        return out
    config = DeepseekV3Config(**SHAPE)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    layers = moe_layers(model)
    routers = {layer.router_name for layer in layers}

    def packed(prefix: str, rows: int, columns: int) -> dict[str, torch.Tensor]:
        scale = torch.empty(rows, columns // GROUP_SIZE).uniform_(0.5, 2.0, generator=generator)
        return {
            f"{prefix}.weight_packed": torch.randint(
                0, 256, (rows, columns // 2), dtype=torch.uint8, generator=generator
            ),
            f"{prefix}.weight_scale": scale.to(torch.float8_e4m3fn),
            f"{prefix}.weight_global_scale": torch.full((1,), 448.0 * 6.0),
            f"{prefix}.input_global_scale": torch.full((1,), 448.0 * 6.0),
        }

    tensors, shards, size = {}, [], 0

    def add(named: dict[str, torch.Tensor]) -> None:
        nonlocal size
        tensors.update(named)
        size += sum(t.nbytes for t in named.values())
        if size >= SHARD_BYTES:
            flush()

    def flush() -> None:
        nonlocal tensors, size
        if tensors:
            shards.append(dict(tensors))
            tensors, size = {}, 0

    head = model.get_output_embeddings()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head and name not in routers:
            add(
                packed(
                    disk_name(model, f"{name}.weight", module.weight.shape).removesuffix(".weight"),
                    module.out_features,
                    module.in_features,
                )
            )
    for layer in layers:
        for projection in expert_projections(layer.experts):
            shape = getattr(layer.experts, projection).shape
            for piece in expert_pieces(model, f"{layer.experts_name}.{projection}", shape):
                add(packed(piece.prefix, piece.stop - piece.start, shape[2]))
    packed_names = {f"{layer.experts_name}.{p}" for layer in layers for p in expert_projections(layer.experts)}
    for key, tensor in model.state_dict().items():
        owner = key.rpartition(".")[0]
        linear = (
            isinstance(model.get_submodule(owner), torch.nn.Linear)
            and owner not in routers
            and model.get_submodule(owner) is not head
        )
        if key in packed_names or linear:
            continue
        value = (
            torch.empty(tensor.shape).normal_(0.0, 0.02, generator=generator)
            if tensor.is_floating_point()
            else torch.zeros(tensor.shape, dtype=tensor.dtype)
        )
        if key.endswith("norm.weight"):
            value = torch.ones(tensor.shape)
        add({disk_name(model, key, tensor.shape): value})
    flush()
    out.mkdir(parents=True, exist_ok=True)
    for i, shard in enumerate(shards):
        save_file(shard, out / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors", metadata={"format": "pt"})
    config_dict = config.to_dict()
    config_dict["quantization_config"] = nvfp4_quantization_config(ignore=["lm_head", *sorted(routers)])
    (out / "config.json").write_text(json.dumps(config_dict, indent=2))
    return out


def tensor_bytes(model_dir: Path) -> tuple[int, int]:
    """S, the checkpoint's tensor bytes, and the largest decoder block's (one MoE layer, all its
    experts), from the headers as the trainer's loader reads them."""
    from rlvr.models.checkpoint_files import CheckpointFiles

    files, per_layer = CheckpointFiles(model_dir), {}
    sizes = {key: files.meta(key).nbytes for key in files.keys()}
    for key, size in sizes.items():
        if key.startswith("model.layers."):
            layer = key.split(".")[2]
            per_layer[layer] = per_layer.get(layer, 0) + size
    return sum(sizes.values()), max(per_layer.values())


def run(model_dir: Path, ranks: int, reports: Path) -> dict:
    import multiprocessing as mp

    from rlvr.config import AlgorithmConfig, LoraConfig, TrainerConfig
    from rlvr.models.folder import read_model_folder
    from rlvr.records import TrainBatch
    from rlvr.training.worker import RankSpec

    context = mp.get_context("spawn")

    def launch(world_size, spec):
        port = free_port()
        return [
            MeasuredRankProcess(context, r, world_size, port, spec, reports / f"rank{r}.json")
            for r in range(world_size)
        ]

    generator = torch.Generator().manual_seed(1)
    sequences = [torch.randint(4, SHAPE["vocab_size"], (48,), generator=generator).tolist() for _ in range(4)]
    trainer_cfg = TrainerConfig(
        ranks=ranks,
        lora=LoraConfig(rank=8, alpha=16.0, dropout=0.0, target_modules="all-linear"),
        micro_batch_tokens=48,
        start_timeout_s=1800,
    )  # one sequence each: the same GEMMs at any N
    spec = RankSpec(
        folder=read_model_folder(model_dir),
        dtype="float32",
        trainer=trainer_cfg,
        algorithm=AlgorithmConfig(),
        seed=0,
        total_steps=1,
        threads=1,
    )
    started = time.perf_counter()
    with Trainer(spec, launch=launch) as trainer:
        loaded_at = time.monotonic()
        loaded = time.perf_counter() - started
        logprobs = trainer.logprobs(sequences, [16] * len(sequences))
        trainer.train_step(
            TrainBatch(
                prompt_ids=[s[:16] for s in sequences],
                completion_ids=[s[16:] for s in sequences],
                sampler_logprobs=[lp for lp in logprobs],
                advantages=torch.linspace(-1.0, 1.0, 4),
                group=torch.zeros(4, dtype=torch.long),
            )
        )
    memory = [json.loads((reports / f"rank{r}.json").read_text()) for r in range(ranks)]
    return {
        "ranks": ranks,
        "load_s": loaded,
        "logprobs": logprobs,
        "baseline": [m["baseline"] for m in memory],
        "load_peak_above_baseline": [max(v for t, v in m["peaks"] if t <= loaded_at) - m["baseline"] for m in memory],
        "run_peak_above_baseline": [m["peaks"][-1][1] - m["baseline"] for m in memory],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "artifacts" / "load_memory_nvfp4")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()

    model_dir = write_checkpoint(args.checkpoint)
    total, block = tensor_bytes(model_dir)
    on_disk = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    rows = []
    for ranks in args.ranks:
        reports = args.out.parent / f"load_memory_{ranks}ranks"
        reports.mkdir(parents=True, exist_ok=True)
        row = run(model_dir, ranks, reports)
        row["bound"] = 1.2 * total / ranks + block
        row["within_bound"] = max(row["load_peak_above_baseline"]) <= row["bound"]
        rows.append(row)
        print(
            f"{ranks} ranks: load peak above baseline {[round(p / 1e6) for p in row['load_peak_above_baseline']]} MB "
            f"(bound {row['bound'] / 1e6:.0f} MB), with the step {[round(p / 1e6) for p in row['run_peak_above_baseline']]} MB, "
            f"load {row['load_s']:.1f} s",
            flush=True,
        )
    reference = rows[0]["logprobs"]
    equal = all(row["logprobs"] == reference for row in rows)
    largest_gap = max(
        abs(a - b) for row in rows for got, want in zip(row["logprobs"], reference) for a, b in zip(got, want)
    )
    result = {
        "checkpoint": str(model_dir),
        "tensor_bytes": total,
        "bytes_on_disk": on_disk,
        "block_bytes": block,
        "cpu": _cpu(),
        "logprobs_equal_across_ranks": equal,
        "logprobs_largest_gap": largest_gap,
        "runs": [{k: v for k, v in row.items() if k != "logprobs"} for row in rows],
        "ok": equal and all(row["within_bound"] for row in rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table = "; ".join(
        f"{row['ranks']} rank{'s' if row['ranks'] > 1 else ''}: load **{max(row['load_peak_above_baseline']) / 1e6:.0f} MB** "
        f"(S/N {total / row['ranks'] / 1e6:.0f}, bound {row['bound'] / 1e6:.0f}), with the step "
        f"{max(row['run_peak_above_baseline']) / 1e6:.0f} MB"
        for row in rows
    )
    line = (
        f"- sharded load, DeepSeek-V3-shaped NVFP4 checkpoint ({on_disk / 1e9:.2f} GB on disk, S = {total / 1e9:.2f} GB of "
        f"tensors, one block {block / 1e6:.0f} MB), one rank process per N, the largest rank's private memory (RssAnon) "
        f"above its after-import baseline while loading, then over logprobs + one LoRA step (CPU heap kept, see the "
        f"script): {table}; logprobs equal across N: {equal} (largest gap {largest_gap:.1e}); {_cpu()} | `python benchmarks/load_memory.py --out {args.out}`\n"
    )
    with open(ROOT / "docs" / "benchmarks.md", "a") as ledger:
        ledger.write(line)
    print(line, end="")
    sys.exit(0 if result["ok"] else 1)


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return os.uname().machine


if __name__ == "__main__":
    main()
