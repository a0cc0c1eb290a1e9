"""KL penalty between the policy and a reference policy, per token.

Schulman, "Approximating KL divergence" (2020, http://joschu.net/blog/kl-approx.html): with
tokens sampled from the policy and x = ref_logprobs - logprobs = log(pi_ref / pi),
k1 = -x, k2 = x^2 / 2, k3 = (e^x - 1) - x estimate KL(pi || pi_ref). k3 is unbiased, never
negative and of low variance; k1 is unbiased but can be negative; k2 is biased but low variance.

As a loss, what matters is the gradient: with samples from pi, E[grad k2] = E[(logp - ref) grad
logp] = grad KL(pi || pi_ref), while E[grad k3] = E[(1 - pi_ref / pi) grad logp] = grad
KL(pi_ref || pi), the reverse direction, and E[grad k1] = 0. ``k3+`` is k3's value (what is
logged) with k2's gradient, a straight-through estimator (verl's ``k3+`` / ``low_var_kl+``).
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_KINDS = ("k1", "k2", "k3", "k3+")


def kl_penalty(kind: str, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token KL estimate [B, T] (elementwise; mask and aggregate it yourself).

    - ``k1``: logprobs - ref_logprobs
    - ``k2``: (logprobs - ref_logprobs)^2 / 2
    - ``k3``: exp(ref - logp) - (ref - logp) - 1   (GRPO's KL term, DeepSeekMath eq. 4)
    - ``k3+``: the value of k3, the gradient of k2: k2 - sg(k2) + sg(k3), so d/dlogp = logp - ref

    Two uses: as a loss term, ``kl_coef * aggregate(kl_penalty(kind, lp, ref), mask, agg)``
    (GRPO, gradient flows through ``logprobs``); or folded into the reward,
    ``token_rewards - kl_coef * kl_penalty(kind, lp, ref).detach()`` (PPO-RLHF, usually k1).
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs).square()
    if kind == "k3":
        log_ratio = ref_logprobs - logprobs
        # expm1 keeps the digits that exp(x) - 1 loses when the policies are close (x ~ 0).
        return torch.expm1(log_ratio) - log_ratio
    if kind == "k3+":
        k2 = kl_penalty("k2", logprobs, ref_logprobs)
        return k2 - k2.detach() + kl_penalty("k3", logprobs, ref_logprobs).detach()
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_KINDS}")
