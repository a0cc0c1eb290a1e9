"""Sharded loading (rlvr.quant.skeleton): each FSDP2 rank reads only its rows, and the ranks
together hold exactly what one process loading the whole checkpoint holds, LoRA's initial
factors included, byte for byte, for NVFP4 (MoE experts and Linears), NF4 and float bases."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlvr.models.tiny import build_tiny_model
from rlvr.quant import load_quantized_model, quantize_checkpoint
from rlvr.quant.skeleton import Skeleton
from rlvr.training.policy import apply_lora

SIZES = dict(hidden_size=64, num_heads=4, num_kv_heads=4, num_layers=3, intermediate_size=128)
LORA = dict(rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """Raw bytes: the packed bytes' float16 view holds NaN patterns, which equal nothing."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _whole(model_dir: str, base_format: str, seed: int) -> dict[str, torch.Tensor]:
    """What the loader before sharding gave a rank: the whole model, then LoRA from `seed`."""
    torch.manual_seed(seed)
    if base_format == "hf":
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    else:
        model = load_quantized_model(model_dir)
    model = apply_lora(model, **LORA, target_experts=base_format == "nvfp4")
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _sharded_rank(rank: int, world_size: int, port: int, model_dir: str, base_format: str, seed: int, out) -> None:
    """One FSDP2 rank as the trainer builds it: the gathered tensors, and the rows it read."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    import rlvr.quant.skeleton as skeleton_module
    from rlvr.training.policy import shard_and_load

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    read = []
    real_read = skeleton_module.CheckpointFiles.read

    def counting_read(self, key, rows=None):
        tensor = real_read(self, key, rows)
        read.append(tensor.nbytes)
        return tensor

    skeleton_module.CheckpointFiles.read = counting_read
    try:
        torch.manual_seed(seed)
        skeleton = Skeleton.from_checkpoint(model_dir, torch.float32)
        model = apply_lora(skeleton.model, **LORA, target_experts=base_format == "nvfp4")
        shard_and_load(model, skeleton, init_device_mesh("cpu", (world_size,)), torch.float32, "cpu")
        tensors = {}  # name -> (first row, the rows' bytes); numpy: pickled by value
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if isinstance(tensor, DTensor):
                _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
                tensors[name] = (offset[0], _bytes(tensor.to_local()).numpy().copy())
            else:
                tensors[name] = (None, _bytes(tensor).numpy().copy())
        out.put((rank, tensors, sum(read), skeleton.base_format))
    except Exception as error:  # the test fails with it, not with a timeout
        out.put((rank, repr(error), 0, None))
        raise
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(model_dir, base_format: str, world_size: int, seed: int) -> dict[int, tuple]:
    port, ctx = _free_port(), mp.get_context("spawn")
    out = ctx.Queue()
    processes = [
        ctx.Process(target=_sharded_rank, args=(r, world_size, port, str(model_dir), base_format, seed, out))
        for r in range(world_size)
    ]
    for p in processes:
        p.start()
    results = {r: rest for r, *rest in (out.get(timeout=300) for _ in processes)}
    for p in processes:
        p.join(timeout=60)
    return results


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded-load")
    moe = build_tiny_model(root / "moe", "deepseek_v3", **SIZES)
    dense = build_tiny_model(root / "dense", "qwen2", tie_word_embeddings=True, **SIZES)
    return {
        "nvfp4": quantize_checkpoint(moe, root / "moe-nvfp4"),
        "nf4": quantize_checkpoint(dense, root / "dense-nf4", format="nf4"),
        "hf": dense,
    }


@pytest.mark.slow
@pytest.mark.parametrize("base_format", ["nvfp4", "nf4", "hf"])
def test_ranks_read_their_rows_and_together_hold_the_whole_load(checkpoints, base_format):
    model_dir = checkpoints[base_format]
    want = {name: _bytes(t) for name, t in _whole(str(model_dir), base_format, seed=3).items()}
    file_bytes = sum(t.nbytes for f in model_dir.glob("*.safetensors") for t in load_file(f).values())
    results = _run(model_dir, base_format, world_size=2, seed=3)
    for rank, (tensors, read_bytes, loaded_format) in results.items():
        assert loaded_format == base_format, tensors
        assert tensors.keys() == want.keys()
        for name, (first_row, got) in tensors.items():
            if first_row is None:  # replicated (buffers): whole on every rank
                assert torch.equal(torch.from_numpy(got), want[name]), (rank, name)
    for name in want:
        # the ranks' rows, in row order, are the whole load's tensor
        shards = sorted((results[r][0][name] for r in results), key=lambda shard: shard[0] or 0)
        if shards[0][0] is not None:
            assert torch.equal(torch.from_numpy(np.concatenate([got for _, got in shards])), want[name]), name
    for rank, (tensors, read_bytes, loaded_format) in results.items():
        # its own rows of everything sharded, plus the small replicated scales: well under the whole
        assert read_bytes < 0.75 * file_bytes, (rank, read_bytes, file_bytes)
    assert sum(read for _, read, _ in results.values()) >= 0.9 * file_bytes  # between them, everything
