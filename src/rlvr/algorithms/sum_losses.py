"""The Tinker API's built-in losses, as sums over tokens, in terms of the policy losses here.

Every input is per token, [B, T] like the logprobs: a datum's `weights` (cross_entropy),
`advantages` and the sampler's `logprobs` (the policy-gradient losses). Tinker's definitions
(tinker-docs, "Loss functions"), with rho = exp(logprobs - sampler logprobs):

- ``cross_entropy``:        -sum w * logprobs (any float weights, negatives included)
- ``importance_sampling``:  -sum rho * A (PPO without a clip)
- ``ppo``:                  -sum min(rho A, clip(rho, low, high) A)
- ``cispo``:                -sum sg(clip(rho, low, high)) A logprobs

`low` / `high` are ratio bounds (Tinker's clip_low_threshold / clip_high_threshold, default
0.8 / 1.2), not the distances from 1 that `policy_loss` takes.
"""

from __future__ import annotations

import math

from torch import Tensor

from rlvr.algorithms.losses import aggregate, policy_loss

SUM_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
# the per-token inputs each loss reads, besides target_tokens
SUM_LOSS_INPUTS = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("advantages", "logprobs"),
    "ppo": ("advantages", "logprobs"),
    "cispo": ("advantages", "logprobs"),
}
DEFAULT_CLIP_THRESHOLDS = (0.8, 1.2)


def sum_loss(
    name: str,
    logprobs: Tensor,
    inputs: dict[str, Tensor],
    mask: Tensor,
    clip_thresholds: tuple[float, float] = DEFAULT_CLIP_THRESHOLDS,
) -> Tensor:
    """The loss `name` summed over the tokens `mask` keeps (padding); `inputs` as SUM_LOSS_INPUTS says."""
    if name == "cross_entropy":
        return aggregate(-inputs["weights"] * logprobs, mask, "token_sum")
    if name not in SUM_LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of {SUM_LOSSES}")
    low, high = (
        (math.inf, math.inf) if name == "importance_sampling" else (1 - clip_thresholds[0], clip_thresholds[1] - 1)
    )
    loss, _ = policy_loss(
        "cispo" if name == "cispo" else "ppo",
        logprobs,
        inputs["logprobs"],
        inputs["advantages"],
        mask,
        clip_low=low,
        clip_high=high,
        agg="token_sum",
    )
    return loss
