"""DAPO's batch shaping (Yu et al. 2025): dynamic sampling, overlong filter, overlong penalty.

Dynamic sampling: a group whose responses all got the same reward has advantage 0 for every
member (GRPO, RLOO, Dr.GRPO alike), so it adds no gradient and only dilutes the batch. DAPO
drops such groups and samples more prompts until the batch holds enough informative groups.
The functions here are pure; rlvr.rollout.collect's refill loop calls them:

    kept = informative_group_mask(rewards, group)
    missing = groups_to_refill(kept_groups, target_groups)   # sample that many more prompts
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms.groups import dense_group_index, group_amax, group_amin


def informative_group_mask(rewards: Tensor, group: Tensor) -> Tensor:
    """bool [B]: True for responses whose group's rewards are not all equal.

    Groups of one are never informative (nothing to compare with) and are dropped.
    """
    index, num_groups = dense_group_index(group)
    spread = group_amax(rewards, index, num_groups) - group_amin(rewards, index, num_groups)
    return (spread > 0)[index]


def groups_to_refill(kept_groups: int, target_groups: int) -> int:
    """How many more informative groups the batch still needs (never negative)."""
    return max(0, target_groups - kept_groups)


def overlong_filter(mask: Tensor, truncated: Tensor) -> Tensor:
    """The loss mask [B, T] with every token of truncated responses (finish_reason "length",
    bool [B]) removed: a cut-off answer is not wrong, so it should not be punished (DAPO §3.4)."""
    return mask.bool() & ~truncated.bool().unsqueeze(-1)


def overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (eq. 13), added to the reward, [B] float.

    With L_max = max_len (the generation budget) and L_cache = cache_len (the soft zone):
        0                                   if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
        -1                                  if |y| > L_max
    times ``factor``. The paper uses L_max = 20480, L_cache = 4096.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    excess = (max_len - cache_len - lengths.to(torch.get_default_dtype())) / cache_len
    return factor * excess.clamp(min=-1.0, max=0.0)
