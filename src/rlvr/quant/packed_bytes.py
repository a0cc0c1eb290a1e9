"""Packed 4-bit bytes held as float16 parameters, so that every supported torch's FSDP2 shards them.

FSDP2 wraps each shard in `nn.Parameter(dtensor)` before it copies the original's
`requires_grad`; torch 2.11 (the GPU image's) then refuses an integer dtype ("only Tensors of
floating point dtype can require gradients"), and a run would have to keep the whole packed base
on every GPU. A float dtype of the same bytes avoids that. Two bytes per element, not one:
gloo's all-gather has no float8 kernel, and a unit whose tensors are all float8 (values and
FP8 scales) would be gathered in float8; with values as float16 beside FP8 scales every packed
unit mixes dtypes, which FSDP2 gathers as raw bytes on every backend. Nothing computes on the
float16 view: the bytes are only copied (sharded, gathered) and read back as uint8 by
`as_bytes` before dequantizing. Rows are never split (2 bytes are 4 weights of one row; rows
hold a multiple of 16), so FSDP2's row sharding is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

STORAGE_DTYPE = torch.float16


def frozen_bytes(packed: torch.Tensor) -> nn.Parameter:
    """A frozen parameter holding uint8 `packed` (`[..., columns]`, columns even) as float16."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed bytes must be uint8, not {packed.dtype}")
    return nn.Parameter(packed.view(STORAGE_DTYPE), requires_grad=False)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The uint8 bytes of a packed tensor, stored as `frozen_bytes` or given as uint8 (a view)."""
    return tensor.view(torch.uint8)
