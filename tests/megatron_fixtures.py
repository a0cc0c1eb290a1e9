"""What the Megatron tests share: tiny dense and MLA + MoE folders whose norms and biases are
random too (a freshly built model has unit norms and zero biases, which hide a misplaced one),
and ranks run as spawned processes over gloo."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from rlvr.models.tiny import build_tiny_model

# 4 query heads over 2 key/value groups: tensor parallel 2 splits both
SIZES = dict(hidden_size=64, num_heads=4, num_kv_heads=2, num_layers=2, intermediate_size=128)


def dense_folder(out_dir: Path, arch: str, tied: bool = True, **extras) -> Path:
    """A tiny dense model (`extras`: config.json overrides)."""
    path = build_tiny_model(out_dir, arch, tie_word_embeddings=tied, **SIZES, **extras)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:  # norms around 1, biases around 0
                param.add_(0.2 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(path)
    return path


def moe_folder(out_dir: Path, arch: str = "deepseek_v3", **extras) -> Path:
    """A tiny MLA + MoE model (`arch`: deepseek_v3 or mistral4; `extras`: config.json overrides):
    layer 0 dense, then two MoE layers of 8 routed experts and a shared expert (DeepSeek-V3: top 2
    of the best of 2 groups). Its routers' weights are large enough that no two experts' scores
    are within rounding of each other (the two backends' float32 sums must choose alike), and
    DeepSeek-V3's correction biases random, so that they change some choices."""
    path = build_tiny_model(out_dir, arch, hidden_size=64, num_heads=4, num_layers=3, intermediate_size=128, **extras)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(0.2 * torch.randn(param.shape, generator=generator))
            if name.endswith("mlp.gate.weight"):
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    model.save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target, world_size: int, *args, timeout: float = 300) -> dict[int, object]:
    """`target(rank, world_size, *args)` in `world_size` spawned processes joined over gloo;
    each rank's return value (or the error it raised, raised here)."""
    port, ctx = free_port(), mp.get_context("spawn")
    out = ctx.Queue()
    processes = [ctx.Process(target=_rank, args=(r, world_size, port, target, args, out)) for r in range(world_size)]
    for p in processes:
        p.start()
    results = dict(out.get(timeout=timeout) for _ in processes)
    for p in processes:
        p.join(timeout=60)
    errors = [value for value in results.values() if isinstance(value, BaseException)]
    if errors:
        raise errors[0]
    return results


def _rank(rank: int, world_size: int, port: int, target, args, out) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        out.put((rank, target(rank, world_size, *args)))
    except Exception as error:  # the test fails with it, not with a timeout
        out.put((rank, RuntimeError(f"rank {rank}: {error!r}")))
        raise
    finally:
        dist.destroy_process_group()
