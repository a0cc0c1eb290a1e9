"""Advantage estimators: one scalar per response from its reward and its group's rewards.

All outcome estimators share `advantages(estimator, rewards, group)`. Rewards are [B], one per
response; `group` [B] int64 names the prompt each response answers (any ids, any order, groups
of unequal size). The group-baseline estimators give a group of one 0 (no baseline to compare
with); `reinforce_pp` has a batch baseline and no groups.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlvr.algorithms.groups import dense_group_index, group_amax, group_amin, group_sum

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")


def advantages(
    estimator: str,
    rewards: Tensor,
    group: Tensor,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
    lengths: Tensor | None = None,
) -> Tensor:
    """Advantage of each response, [B], in the dtype of `rewards` (float32 if it is integral).

    With n_g the size of response i's group g, mean_g and std_g its mean and unbiased
    (Bessel, n_g - 1) standard deviation:

    - ``grpo`` (Shao et al. 2024, DeepSeekMath):  A_i = (r_i - mean_g) / (std_g + eps).
      ``std_normalize=False`` drops the division, which is ``dr_grpo``.
    - ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-Like Training"):  A_i = r_i - mean_g.
    - ``rloo`` (Ahmadian et al. 2024, "Back to Basics"):  A_i = r_i - (sum_g - r_i) / (n_g - 1),
      the mean of the *other* responses; equal to n_g / (n_g - 1) * (r_i - mean_g).
    - ``reinforce_pp`` (Hu 2025, REINFORCE++, arXiv:2501.03262):  no group baseline; the
      rewards are whitened over the batch, A_i = whiten(r)_i.
    - ``reinforce_pp_baseline`` (same paper):  c_i = r_i - mean_g, then A_i = whiten(c)_i.

    whiten(x)_i = (x_i - mu) / (sigma + eps), with mu and sigma the mean and unbiased std over
    the batch's *tokens*: response i counts ``lengths[i]`` times (its loss tokens, each of which
    carries the same outcome return), N = sum_i lengths[i] samples, sigma^2 =
    sum_i lengths[i] (x_i - mu)^2 / (N - 1). This is verl's and SkyRL's token-level masked
    whitening of a return that is constant along the response (gamma = 1, an outcome reward).
    Without ``lengths`` every response counts once (N = B).

    ``std_normalize`` is read by ``grpo`` only, ``lengths`` [B] by the two whitening estimators
    only. A group of one gets 0 from grpo, dr_grpo, rloo (and 0 before whitening from
    reinforce_pp_baseline); a group (grpo) or batch (whitening) whose values are all equal gets
    0, even with eps=0 and rewards that do not average exactly in floating point.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {ESTIMATORS}")
    if rewards.dim() != 1 or group.shape != rewards.shape:
        raise ValueError(f"rewards and group must both be [B]; got {tuple(rewards.shape)} and {tuple(group.shape)}")
    if lengths is not None and lengths.shape != rewards.shape:
        raise ValueError(f"lengths must be [B] like rewards; got {tuple(lengths.shape)} and {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if estimator == "reinforce_pp":
        return _whiten(rewards, lengths, eps)

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
        std = (squares / (count - 1).clamp(min=1)).sqrt()
        # A group of one, or of equal rewards, gets 0 outright: its centred rewards are 0 only up
        # to rounding (7 rewards of 0.1 do not average to 0.1 in float32), and with a tiny std
        # that rounding would come out as advantages of +-1.
        spread = (group_amax(rewards, index, num_groups) - group_amin(rewards, index, num_groups))[index]
        return torch.where(spread > 0, centred / (std + eps), 0.0)
    # reinforce_pp_baseline: group baseline, then one batch-wide whitening.
    return _whiten(centred, lengths, eps)


def _whiten(values: Tensor, lengths: Tensor | None, eps: float) -> Tensor:
    """(x - mu) / (sigma + eps) with token-weighted batch statistics (see `advantages`)."""
    weights = torch.ones_like(values) if lengths is None else lengths.to(values.dtype)
    if (weights < 0).any():
        raise ValueError("lengths must be >= 0")
    counted = weights > 0
    n = weights.sum()
    mean = (weights * values).sum() / n.clamp(min=1)
    var = (weights * (values - mean).square()).sum() / (n - 1).clamp(min=1)
    spread = torch.where(counted, values, -math.inf).amax() - torch.where(counted, values, math.inf).amin()
    return torch.where((n > 1) & (spread > 0), (values - mean) / (var.sqrt() + eps), 0.0)
