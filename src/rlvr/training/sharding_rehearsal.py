"""What a trainer rank would hold, measured on the real module tree at the run's real size with
no GPU and no weights: `rlvr rehearse`'s sharding half.

For each rank asked, the trainer's policy is built as its ranks build it (the skeleton on the
meta device, LoRA, `TokenLogprobs`, `shard`), with `fully_shard` run under torch's fake process
group at the config's world size and mesh (HSDP too), so FSDP2 itself decides each rank's rows.
Then, in bytes:

- base_shard: the rank's local rows of every frozen parameter (packed values, FP8 scales,
  biases, norms, embeddings, routers);
- gathered: 2 x the largest decoder block unsharded as FSDP2 gathers it (trainable tensors at
  the mixed-precision param dtype, frozen ones as stored): the block it runs and the prefetched one;
- trainable: the rank's local rows of the trainable parameters, value and gradient;
- optimizer: AdamW's state for those rows, created by AdamW itself (exp_avg, exp_avg_sq).

The model is the checkpoint's when `model.path` holds one (its headers only), else the one
`model.estimate` describes, packed as `quantize_checkpoint` would write it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from rlvr.config import RunConfig
from rlvr.hardware import compute_dtype, local_device
from rlvr.models.estimate import estimate_config
from rlvr.models.folder import config_file
from rlvr.quant.skeleton import Skeleton
from rlvr.training.policy import TokenLogprobs, apply_lora, decoder_blocks, shard


def measure_ranks(cfg: RunConfig, ranks: list[int]) -> list[dict[str, int]]:
    """Each rank's bytes (see the module doc-string), in the order of `ranks`."""
    return [_measure(cfg, rank) for rank in ranks]


def held_bytes(params: list[torch.Tensor]) -> dict[str, int]:
    """base_shard, trainable (value and gradient) and optimizer of a rank's parameters on meta
    (each its local part where it is a DTensor): AdamW's state as AdamW itself creates it."""
    trainable = [p for p in params if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, foreach=False)
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW creates its state, on meta: nothing is computed
    return {
        "base_shard": sum(_local_bytes(p) for p in params if not p.requires_grad),
        "trainable": 2 * sum(_local_bytes(p) for p in trainable),
        "optimizer": sum(
            _local_bytes(t) for state in optimizer.state.values() for name, t in state.items() if name != "step"
        ),
    }


def _local_bytes(p: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = p.to_local() if isinstance(p, DTensor) else p
    return local.numel() * local.element_size()


def rehearsal_skeleton(cfg: RunConfig, dtype: torch.dtype) -> Skeleton:
    """The run's model on the meta device: the checkpoint's (its headers only), else model.estimate's."""
    path = Path(cfg.model.path)
    if config_file(path).is_file() and any(path.glob("*.safetensors")):
        return Skeleton.from_checkpoint(path, dtype)
    if cfg.model.estimate is None:
        raise ValueError(
            f"model.path: {path} holds no checkpoint and the config has no model.estimate to build one from"
        )
    base_format = "nvfp4" if cfg.model.estimate.weight_format == "nvfp4" else "hf"
    return Skeleton.from_config(estimate_config(cfg.model.estimate), dtype, base_format)


def _measure(cfg: RunConfig, rank: int) -> dict[str, int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world_size, trainer = cfg.trainer.ranks, cfg.trainer
    shard_ranks = trainer.shard_ranks or world_size
    dtype = compute_dtype(cfg.model.dtype, local_device(cfg.placement.gpus_per_node)).torch
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        base = rehearsal_skeleton(cfg, dtype).model
        lm = apply_lora(base, **trainer.lora.model_dump(), shapes_only=True) if trainer.lora else base
        policy = TokenLogprobs(lm, trainer.logits_chunk_mb)
        # the worker's mesh: 1-D over every rank, or replicas x shards (HSDP)
        mesh = (
            init_device_mesh("cpu", (world_size,))
            if shard_ranks == world_size
            else init_device_mesh(
                "cpu", (world_size // shard_ranks, shard_ranks), mesh_dim_names=("replicate", "shard")
            )
        )
        policy.to("meta")  # what was built for real (rotary buffers, expert LoRA): only shapes are measured
        shard(policy, mesh, param_dtype=dtype, reduce_dtype=torch.float32)
        blocks = [
            sum(p.numel() * (dtype.itemsize if p.requires_grad else p.element_size()) for p in block.parameters())
            for block in decoder_blocks(policy)
        ]
        return {"gathered": 2 * max(blocks)} | held_bytes(list(policy.parameters()))
    finally:
        dist.destroy_process_group()
