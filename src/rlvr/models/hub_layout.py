"""Tensor names on disk (the Hub layout) vs in memory (transformers 5's converted layout).

transformers 5 converts some checkpoint tensors when it loads them: MoE experts, stored one
Linear per expert (`...experts.{i}.gate_proj.weight`, `...experts.{i}.w1.weight`), become
fused 3-D parameters (`...experts.gate_up_proj` [E, 2I, H]), and some modules are renamed
(Mixtral's `block_sparse_moe` is `mlp` in memory). `save_pretrained` undoes this with
`transformers.core_model_loading.revert_weight_conversion`, from the model's own conversion
mapping. rlvr uses that same function, so it needs no per-model names:

- a tensor stored under one name maps through `revert_weight_conversion` to its disk name;
- a fused experts parameter is reverted once as an *index* tensor `[E, rows, 2]` holding each
  row's number: the pieces that come back name every on-disk expert projection and say which
  rows of which expert it holds. Packed NVFP4 tensors (uint8 values, FP8 scales) are split and
  joined along those rows, never along the packed last dimension, so the same pieces serve
  them. A conversion that moves the last dimension (a transpose) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.core_model_loading import revert_weight_conversion


@dataclass(frozen=True)
class ExpertPiece:
    """One on-disk expert projection (`prefix.weight`): rows `[start, stop)` of expert `expert`
    in a fused parameter; `part` numbers the expert's pieces in row order (gate 0, up 1)."""

    prefix: str
    expert: int
    part: int
    start: int
    stop: int


def disk_tensors(model: nn.Module, key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """The on-disk tensors that the in-memory tensor `key` is saved as."""
    return revert_weight_conversion(model, {key: tensor})


def disk_name(model: nn.Module, key: str, shape: torch.Size) -> str:
    """The on-disk name of the in-memory tensor `key`, which must be stored whole under one name."""
    (name, stored), *more = disk_tensors(model, key, torch.empty(shape, device="meta")).items()
    if more or stored.shape != shape:
        raise ValueError(f"{type(model).__name__}: {key} is stored split on disk, as {name} and {len(more)} more")
    return name


def expert_pieces(model: nn.Module, key: str, shape: torch.Size) -> list[ExpertPiece]:
    """Where each row of the fused experts parameter `key` (`[E, rows, in]`) lives on disk."""
    experts, rows = shape[0], shape[1]
    index = (
        torch.arange(experts * rows, dtype=torch.float64).view(experts, rows, 1) * 2 + torch.arange(2)
    ).contiguous()
    pieces = []
    for name, stored in disk_tensors(model, key, index).items():
        first = int(stored.reshape(-1)[0]) // 2
        expected = torch.arange(2 * first, 2 * first + stored.numel(), dtype=torch.float64).view(-1, 2)
        if not name.endswith(".weight") or stored.shape != expected.shape or not torch.equal(stored, expected):
            raise ValueError(
                f"{type(model).__name__}: {key} is stored as {name} {tuple(stored.shape)}, not as per-expert "
                f"[out, in] rows; rlvr packs only experts stored one projection per expert"
            )
        expert, start = divmod(first, rows)
        pieces.append(ExpertPiece(name.removesuffix(".weight"), expert, 0, start, start + stored.shape[0]))
    pieces.sort(key=lambda p: (p.expert, p.start))
    per_expert = len(pieces) // experts
    parts = [ExpertPiece(p.prefix, p.expert, i % per_expert, p.start, p.stop) for i, p in enumerate(pieces)]
    if len(pieces) != per_expert * experts or any(p.stop - p.start != rows // per_expert for p in parts):
        raise ValueError(f"{type(model).__name__}: {key} is not stored as equal row blocks per expert")
    return parts


def to_disk(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """In-memory tensors under their on-disk names and shapes (what `save_pretrained` writes)."""
    return revert_weight_conversion(model, state)
