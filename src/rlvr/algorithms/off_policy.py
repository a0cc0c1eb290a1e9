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

The family, and how the peers name its members (rlvr.config's ``algorithm`` keys in brackets):
  truncated IS, TIS  `truncated_is_weights`: min(w, C) [tis_cap, tis_level]; verl
                     ``rollout_is=token|sequence``, TRL ``*_truncate``
  masked IS          `masked_is_weights`: w inside [low, high], 0 outside [masked_is]; token level
                     is IcePop (verl ``rollout_is_threshold="low_high"``), sequence level TRL's
                     ``vllm_importance_sampling_mode="sequence_mask"``
  rejection          `off_policy_keep_mask`: tokens or whole responses outside [low, high] leave
                     the loss mask [rejection]; geometric level is verl's geometric rejection
                     (Geo-RS, ``rollout_rs="seq_mean_k1"``), sequence level ``seq_sum_k1``,
                     token level ``token_k1``. With TIS on top it is sequence-masked TIS
                     (verl's ``decoupled_seq_is_rs`` / ``decoupled_geo_rs_seq_tis`` presets).
The ratio is always taken against the logprob the sampler reported for each token, so under an
asynchronous pipeline each token is corrected for the policy version that produced it.
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


def importance_ratios(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """w = pi_trainer / pi_sampler [B, T] at `level` (token, sequence: the response's product,
    geometric: its per-token mean in log space, spread over the response's positions), detached.
    What the corrections below cap, zero or reject: within the mask, `weights != importance_ratios(...)`
    marks where they acted."""
    return _log_ratio(trainer_logprobs, sampler_logprobs, mask, level).exp()


def truncated_is_weights(
    trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, cap: float, level: str = "token"
) -> Tensor:
    """TIS weights min(w, cap) [B, T], detached; 1 at masked positions.

    Pass them as ``policy_loss(..., is_weights=...)``. Yao et al. use cap C = 2 (token level).
    """
    # min(exp(x), cap) = exp(min(x, log cap)): no overflow for a long sequence-level sum.
    return _log_ratio(trainer_logprobs, sampler_logprobs, mask, level).clamp(max=math.log(cap)).exp()


def masked_is_weights(
    trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, low: float, high: float, level: str = "token"
) -> Tensor:
    """Masked IS weights w * 1[low <= w <= high] [B, T], detached; finite (at most `high`) everywhere.

    Unlike TIS, a ratio outside the band is not capped but zeroed: the token (or, at sequence /
    geometric level, the whole response) gets no gradient, while it still counts in the loss's
    denominator. At token level this is IcePop (Ling Team 2025, "Every Step Evolves: Scaling
    Reinforcement Learning for Trillion-Scale Thinking Model", arXiv:2510.18855, Ring-1T):
    M(k) = k if alpha <= k <= beta else 0, k = pi_train / pi_infer, with alpha = 0.5, beta = 5
    (verl's ``decoupled_token_icepop`` and INTELLECT-3 use the same). At sequence level it is
    TRL's ``vllm_importance_sampling_mode="sequence_mask"`` (TRL's default mode, C_max = 3, no
    lower bound: ``low=0``).
    """
    if not 0 <= low < high:
        raise ValueError(f"masked IS band must satisfy 0 <= low < high; got low={low}, high={high}")
    log_ratio = _log_ratio(trainer_logprobs, sampler_logprobs, mask, level)
    # capped at `high`, which changes no weight inside the band, so that no position (a padded one
    # of a rejected response included) holds an inf whose gradient would be 0 * inf = nan
    weights = log_ratio.clamp(max=math.log(high)).exp()
    return torch.where(mask.bool() & ~_inside(log_ratio, low, high), 0.0, weights)


def _inside(log_ratio: Tensor, low: float, high: float) -> Tensor:
    """low <= exp(log_ratio) <= high, compared in log space (no overflow); low = 0: no lower bound."""
    return (log_ratio >= (math.log(low) if low > 0 else -math.inf)) & (log_ratio <= math.log(high))


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
    return mask.bool() & _inside(_log_ratio(trainer_logprobs, sampler_logprobs, mask, level), low, high)


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
