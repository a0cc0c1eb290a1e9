"""Policy losses (PPO, GSPO, CISPO, SAPO, DPPO) and the reduction of per-token losses to one scalar.

Shapes: logprobs, old_logprobs, mask are [B, T] (B responses, T completion positions, right
padded); advantages are [B] (one per response, broadcast over its tokens) or [B, T]. `mask`
is bool or 0/1: 1 marks a token that takes part in the loss. Padded positions may hold any
value, even inf or nan: they are selected away with `torch.where`, never multiplied by 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

AGGREGATIONS = ("token_mean", "token_sum", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
LOSSES = ("ppo", "gspo", "cispo", "sapo", "dppo_tv", "dppo_kl")

# exp(20) ~ 5e8 is far outside any clip range; clamping the log-ratio there keeps a token whose
# logprob collapsed from overflowing float32 into inf (and nan gradients) in the unclipped branch.
_MAX_LOG_RATIO = 20.0


def aggregate(per_token: Tensor, mask: Tensor, mode: str, max_len: int | None = None) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar over the valid tokens.

    With m the mask, |y_i| = sum_t m_it the number of valid tokens of response i, B the number
    of rows (a row with no valid token counts as a response of loss 0, as in TRL and SkyRL, and in
    verl when it is given global_batch_size):

    - ``token_mean`` (DAPO, Yu et al. 2025):         sum_it m l / sum_it m
    - ``token_sum`` (verl's token-sum):              sum_it m l, no normalisation: the caller scales
      (SkyRL's policy losses return this sum, `reduce_loss`, and get their reductions by dividing
      the advantages beforehand; Tinker's built-in losses report it as ``loss:sum``)
    - ``seq_mean_token_mean`` (GRPO, Shao et al.):   1/B sum_i (sum_t m l / |y_i|)
    - ``seq_mean_token_sum``:                        1/B sum_i  sum_t m l
    - ``seq_mean_token_sum_norm`` (Dr.GRPO, Liu et al. 2025):  1/B sum_i (sum_t m l / max_len),
      max_len a constant (the generation budget), required, so the loss never depends on padding.

    Micro-batching: these are means over the batch given. To reproduce a full batch from
    micro-batches, weight each micro-batch's value by its share of the batch's valid tokens
    (token_mean) or of its rows (seq_* modes); token_sum micro-batches simply add.
    """
    valid = mask.bool()
    masked = torch.where(valid, per_token, 0.0)
    if mode == "token_mean":
        return masked.sum() / valid.sum().clamp(min=1)
    if mode == "token_sum":
        return masked.sum()
    if mode == "seq_mean_token_mean":
        return (masked.sum(-1) / valid.sum(-1).clamp(min=1)).mean()
    if mode == "seq_mean_token_sum":
        return masked.sum(-1).mean()
    if mode == "seq_mean_token_sum_norm":
        if max_len is None:
            raise ValueError("agg='seq_mean_token_sum_norm' needs max_len (the max completion length)")
        return masked.sum(-1).mean() / max_len
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {AGGREGATIONS}")


def dppo_keep_mask(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, divergence: str, delta: float
) -> Tensor:
    """DPPO's trust region (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
    Learning", arXiv:2602.04879): bool [B, T], False where the token's update is masked.

    The divergence between pi and pi_old is taken on the binary distribution {the sampled token,
    everything else}, p = pi(y_t), p_old = pi_old(y_t):
      ``tv``  D = |p - p_old|
      ``kl``  D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))  (1e-8 inside the
              second log, as the authors' verl code has it)
    A token is masked when its update would push D past ``delta`` in the advantage's direction:
    A > 0 and p has risen by more than delta (tv) / D > delta with p >= p_old (kl); A <= 0 and p has
    fallen by more than delta / D > delta with p <= p_old. Unlike the ratio clip, a rare token may
    grow a hundredfold while its probability stays small. Everything here is detached.
    """
    advantages = advantages.expand_as(logprobs)
    log_p, log_p_old = logprobs.detach(), old_logprobs.detach()
    p, p_old = log_p.exp(), log_p_old.exp()
    if divergence == "tv":
        return torch.where(advantages > 0, p - p_old <= delta, p - p_old >= -delta)
    if divergence == "kl":
        within = p_old * (log_p_old - log_p) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8)) <= delta
        return torch.where(advantages > 0, within | (p <= p_old), within | (p >= p_old))
    raise ValueError(f"unknown DPPO divergence {divergence!r}; choose tv or kl")


def policy_loss(
    name: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    sapo_tau_pos: float | None = None,
    sapo_tau_neg: float | None = None,
    dppo_delta: float | None = None,
    agg: str,
    max_len: int | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy-gradient loss to minimise, and detached metrics.

    rho = exp(logprobs - old_logprobs) per token; A the advantage; clip(x) = clamp(x, 1 - clip_low,
    1 + clip_high). Per-token losses, then `aggregate(.., agg, max_len)`:

    - ``ppo`` (Schulman et al. 2017):  l = -min(rho A, clip(rho) A). ``clip_high > clip_low`` is
      DAPO's clip-higher (Yu et al. 2025). ``dual_clip=c`` (c > 1; Ye et al. 2020, "Mastering
      Complex Control in MOBA Games") also bounds the loss of A < 0 tokens: l = min(l, -c A).
    - ``gspo`` (Zheng et al. 2025):  one ratio per response, s_i = exp(mean over valid t of
      (logprobs - old_logprobs)), l = -min(s_i A, clip(s_i) A) on each of its tokens. With
      agg="seq_mean_token_mean" this is exactly the paper's per-sequence mean; the paper's clip
      ranges are tiny (3e-4 / 4e-4), since s_i is a geometric mean.
    - ``cispo`` (MiniMax-M1, 2025):  l = -sg(clip(rho)) A logprobs. The clipped weight carries no
      gradient, so clipped tokens still get a (bounded) gradient. The paper sets no lower bound:
      use clip_low >= 1 for that; its upper bound is 1 + clip_high.
    - ``sapo`` (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347):  a soft
      gate instead of the clip, l = -f(rho) A with f(rho) = sigmoid(tau (rho - 1)) * 4 / tau,
      tau = ``sapo_tau_pos`` where A > 0 and ``sapo_tau_neg`` where A <= 0 (paper: 1.0 and 1.05;
      required for sapo). d f / d rho = 1 at rho = 1, so on-policy its gradient is PPO's; off
      policy the gradient fades smoothly (weight 4 sigma (1 - sigma) rho) instead of dropping to 0
      at the clip. clip_low / clip_high are not read. The paper, TRL and verl aggregate it with
      seq_mean_token_mean.
    - ``dppo_tv`` / ``dppo_kl`` (DPPO, Qi et al. 2026, arXiv:2602.04879): no clip; the policy
      gradient l = -sg(rho) A logprobs (gradient -A d rho) on the tokens `dppo_keep_mask` keeps,
      0 on the others, with threshold ``dppo_delta`` (required; the authors' verl example: 0.15
      for tv, 0.05 for kl). clip_low / clip_high are not read. verl also caps sg(rho) at its
      clip_ratio_c; the authors' example turns that off (10000), as rlvr has it.

    ``is_weights`` [B, T] (e.g. `truncated_is_weights`, for the sampler/trainer mismatch) multiply
    the per-token loss before aggregation.

    Metrics, 0-dim detached tensors (no device sync here; call .item() when logging), token means
    over valid tokens:
    ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` (of rho, or of s_i for gspo);
    ``clip_fraction`` = ``clip_fraction_low`` + ``clip_fraction_high``: tokens whose clipped branch
    is active (ppo/gspo: rho < 1 - clip_low with A < 0, or rho > 1 + clip_high with A > 0, i.e. no
    gradient; cispo: weight clamped below / above; sapo: 0, it has no hard clip; dppo: masked,
    A <= 0 / A > 0);
    ``dual_clip_fraction`` when dual_clip is set;
    ``approx_kl``: k3 estimate of KL(old || new) = mean((rho - 1) - log rho) per token.
    """
    if name not in LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; choose one of {LOSSES}")
    if dual_clip is not None and (name != "ppo" or dual_clip <= 1.0):
        raise ValueError("dual_clip applies to loss 'ppo' only and must be > 1")
    if name == "sapo" and not (sapo_tau_pos and sapo_tau_neg and sapo_tau_pos > 0 and sapo_tau_neg > 0):
        raise ValueError("loss 'sapo' needs sapo_tau_pos > 0 and sapo_tau_neg > 0 (the paper: 1.0 and 1.05)")
    if name.startswith("dppo") and not (dppo_delta and dppo_delta > 0):
        raise ValueError(f"loss {name!r} needs dppo_delta > 0 (the authors: 0.15 for tv, 0.05 for kl)")
    valid = mask.bool()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.expand_as(logprobs)

    token_log_ratio = torch.where(valid, logprobs - old_logprobs, 0.0).clamp(max=_MAX_LOG_RATIO)
    if name == "gspo":
        seq_log_ratio = token_log_ratio.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
        ratio = seq_log_ratio.exp().expand_as(logprobs)
    else:
        ratio = token_log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)

    if name == "cispo":
        per_token = -clipped.detach() * advantages * logprobs
        low, high = ratio < 1.0 - clip_low, ratio > 1.0 + clip_high
    elif name.startswith("dppo"):
        keep = dppo_keep_mask(
            logprobs, old_logprobs, advantages, divergence=name.removeprefix("dppo_"), delta=dppo_delta
        )
        per_token = torch.where(keep, -ratio.detach() * advantages * logprobs, 0.0)
        low, high = ~keep & (advantages <= 0), ~keep & (advantages > 0)
    elif name == "sapo":
        tau = torch.where(advantages > 0, sapo_tau_pos, sapo_tau_neg).to(ratio.dtype)
        per_token = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * advantages
        low = high = torch.zeros_like(valid)
    else:
        per_token = torch.maximum(-advantages * ratio, -advantages * clipped)
        low = (ratio < 1.0 - clip_low) & (advantages < 0)
        high = (ratio > 1.0 + clip_high) & (advantages > 0)
    if dual_clip is not None:
        bound = -dual_clip * advantages
        dual_clipped = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual_clipped, bound, per_token)
    if is_weights is not None:
        per_token = per_token * is_weights

    loss = aggregate(per_token, valid, agg, max_len)

    with torch.no_grad():

        def token_mean(x: Tensor) -> Tensor:
            return aggregate(x.to(logprobs.dtype), valid, "token_mean")

        any_valid = valid.any()
        metrics = {
            "ratio_mean": token_mean(ratio),
            "ratio_min": torch.where(any_valid, torch.where(valid, ratio, math.inf).amin(), 0.0),
            "ratio_max": torch.where(any_valid, torch.where(valid, ratio, -math.inf).amax(), 0.0),
            "clip_fraction_low": token_mean(low),
            "clip_fraction_high": token_mean(high),
            "clip_fraction": token_mean(low | high),
            "approx_kl": token_mean(torch.expm1(token_log_ratio) - token_log_ratio),
        }
        if dual_clip is not None:
            metrics["dual_clip_fraction"] = token_mean(dual_clipped)
    return loss, {k: v.detach() for k, v in metrics.items()}
