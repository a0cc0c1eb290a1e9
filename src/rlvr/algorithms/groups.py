"""Per-group reductions over a flat batch, vectorised with index_add / scatter_reduce.

A batch holds B responses; `group[i]` is the id of the prompt response i answers. Ids are
arbitrary int64 values (dataset row ids), so they are first mapped to dense 0..G-1 indices.
No Python loop over groups anywhere: one scatter per statistic.
"""

from __future__ import annotations

import torch
from torch import Tensor


def dense_group_index(group: Tensor) -> tuple[Tensor, int]:
    """Map prompt ids [B] to dense indices 0..G-1 [B] and return G."""
    ids, index = torch.unique(group, return_inverse=True)
    return index, ids.numel()


def group_sum(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Sum of `values` [B] within each group -> [G]."""
    return values.new_zeros(num_groups).index_add_(0, index, values)


def group_amax(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Largest value within each group -> [G]."""
    return values.new_zeros(num_groups).scatter_reduce_(0, index, values, "amax", include_self=False)


def group_amin(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Smallest value within each group -> [G]."""
    return values.new_zeros(num_groups).scatter_reduce_(0, index, values, "amin", include_self=False)
