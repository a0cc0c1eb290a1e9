"""Off-policy correction between the sampler's logprobs and the trainer's.

The engine (vLLM) samples with its own kernels and precision, so the logprob it reports for a
token differs from the one the trainer recomputes with the same weights; with an async
pipeline the sampler may also lag the trainer by a few updates. The policy-gradient loss is
an expectation under the trainer's "old" policy, while the tokens come from the sampler, so
they are reweighted by w = pi_trainer / pi_sampler (Yao et al. 2025, "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training": truncated importance sampling, TIS),
or tokens/responses whose w is too far from 1 are dropped (masked IS / rejection).

Levels of the ratio, for the valid tokens t of response i (x_t = trainer_t - sampler_t):
  ``token``      w_it = exp(x_t)
  ``sequence``   w_i  = exp(sum_t x_t), the true sequence ratio (explodes with length)
  ``geometric``  w_i  = exp(mean_t x_t), length-normalised, a better threshold for long answers
Sequence-level values are broadcast over the response's tokens. Everything here is detached.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LEVELS = ("token", "sequence", "geometric")


def _log_ratio(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, level: str) -> Tensor:
    valid = mask.bool()
    token = torch.where(valid, trainer_logprobs - sampler_logprobs, 0.0).detach()
    if level == "token":
        return token
    if level == "sequence":
        return token.sum(-1, keepdim=True).expand_as(token)
    if level == "geometric":
        return (token.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)).expand_as(token)
    raise ValueError(f"unknown importance-ratio level {level!r}; choose one of {LEVELS}")


def truncated_is_weights(
    trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, cap: float, level: str = "token"
) -> Tensor:
    """TIS weights min(w, cap) [B, T], detached; 1 at masked positions.

    Pass them as ``policy_loss(..., is_weights=...)``. Yao et al. use cap C = 2 (token level).
    """
    # min(exp(x), cap) = exp(min(x, log cap)): no overflow for a long sequence-level sum.
    return _log_ratio(trainer_logprobs, sampler_logprobs, mask, level).clamp(max=math.log(cap)).exp()


def off_policy_keep_mask(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    high: float,
    low: float | None = None,
    level: str = "token",
) -> Tensor:
    """The loss mask with far off-policy tokens (or whole responses) removed, bool [B, T].

    A token is kept when it was valid and low <= w <= high; ``low`` defaults to 1 / high, and
    ``low=0`` sets no lower bound. Use it as the mask of ``policy_loss`` (masked IS: the dropped
    tokens get no gradient, and leave the denominator of token_mean / seq_mean_token_mean).
    """
    if low is None:
        low = 1.0 / high
    if high <= 0 or low < 0:
        raise ValueError(f"off-policy mask bounds must be 0 <= low and 0 < high; got low={low}, high={high}")
    log_ratio = _log_ratio(trainer_logprobs, sampler_logprobs, mask, level)
    inside = (log_ratio >= (math.log(low) if low > 0 else -math.inf)) & (log_ratio <= math.log(high))
    return mask.bool() & inside


def logprob_gap_metrics(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the sampler is from the trainer, over valid tokens; 0-dim detached tensors.

    ``logprob_abs_diff_mean`` / ``logprob_abs_diff_max``: |trainer - sampler| per token;
    ``sampler_kl``: k3 estimate of KL(pi_sampler || pi_trainer) from the sampled tokens,
    mean((w - 1) - log w) with w = pi_trainer / pi_sampler; ``is_weight_mean``: mean w.
    """
    valid = mask.bool()
    count = valid.sum().clamp(min=1)
    log_ratio = _log_ratio(trainer_logprobs, sampler_logprobs, mask, "token")
    abs_diff = log_ratio.abs()  # 0 at masked positions, so a plain max is the masked max
    return {
        "logprob_abs_diff_mean": abs_diff.sum() / count,
        "logprob_abs_diff_max": abs_diff.amax() if abs_diff.numel() else abs_diff.new_zeros(()),
        "sampler_kl": torch.where(valid, torch.expm1(log_ratio) - log_ratio, 0.0).sum() / count,
        "is_weight_mean": torch.where(valid, log_ratio.exp(), 0.0).sum() / count,
    }
