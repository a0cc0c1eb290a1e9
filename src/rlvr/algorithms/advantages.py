"""Advantage estimators: one scalar per response from its reward and its group's rewards.

All outcome estimators share `advantages(estimator, rewards, group)`. Rewards are [B], one per
response; `group` [B] int64 names the prompt each response answers (any ids, any order, groups
of unequal size). A group of one has no baseline to compare with, so its advantage is 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms.groups import dense_group_index, group_sum

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")


def advantages(
    estimator: str,
    rewards: Tensor,
    group: Tensor,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Advantage of each response, [B], in the dtype of `rewards` (float32 if it is integral).

    With n_g the size of response i's group g, mean_g and std_g its mean and unbiased
    (Bessel, n_g - 1) standard deviation:

    - ``grpo`` (Shao et al. 2024, DeepSeekMath):  A_i = (r_i - mean_g) / (std_g + eps).
      ``std_normalize=False`` drops the division, which is ``dr_grpo``.
    - ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-Like Training"):  A_i = r_i - mean_g.
    - ``rloo`` (Ahmadian et al. 2024, "Back to Basics"):  A_i = r_i - (sum_g - r_i) / (n_g - 1),
      the mean of the *other* responses; equal to n_g / (n_g - 1) * (r_i - mean_g).
    - ``reinforce_pp_baseline`` (Hu 2025, REINFORCE++):  c_i = r_i - mean_g, then
      A_i = c_i / (std(c) + eps) with the unbiased std over the whole batch.

    ``std_normalize`` is read by ``grpo`` only. A group of one gets 0 from every estimator, and
    so does a group (grpo) or batch (reinforce_pp_baseline) whose std is 0.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {ESTIMATORS}")
    if rewards.dim() != 1 or group.shape != rewards.shape:
        raise ValueError(f"rewards and group must both be [B]; got {tuple(rewards.shape)} and {tuple(group.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()

    index, num_groups = dense_group_index(group)
    count = group_sum(torch.ones_like(rewards), index, num_groups)[index]
    total = group_sum(rewards, index, num_groups)[index]
    centred = rewards - total / count

    if estimator == "rloo":
        # Leave-one-out mean of the others; a group of one has no others (0 / 0 avoided).
        others = count - 1
        return torch.where(others > 0, rewards - (total - rewards) / others.clamp(min=1), 0.0)
    if estimator == "dr_grpo" or (estimator == "grpo" and not std_normalize):
        return centred
    if estimator == "grpo":
        squares = group_sum(centred.square(), index, num_groups)[index]
        std = torch.where(count > 1, squares / (count - 1).clamp(min=1), 0.0).sqrt()
        # A group with one response, or all rewards equal, has std 0 and centred rewards 0: give
        # 0 outright, so that eps=0 does not turn it into 0 / 0.
        return torch.where(std > 0, centred / (std + eps), 0.0)
    # reinforce_pp_baseline: group baseline, then one batch-wide scale.
    batch_std = centred.std() if centred.numel() > 1 else centred.new_zeros(())
    return torch.where(batch_std > 0, centred / (batch_std + eps), 0.0)
