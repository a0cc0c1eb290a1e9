"""What a trainer rank's update trains one micro-batch on: the completion tokens the loss covers,
the sampler's logprobs of them, the policy loss with its off-policy corrections and KL term, the
micro-batch's share of the update's loss, and what it adds to the rank's report."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from rlvr.algorithms import (
    aggregate,
    importance_ratios,
    kl_penalty,
    masked_is_weights,
    off_policy_keep_mask,
    policy_loss,
    truncated_is_weights,
)
from rlvr.config import AlgorithmConfig
from rlvr.training.commands import MiniBatch, StepInput
from rlvr.training.packing import MicroBatch
from rlvr.training.report import TrainReport


class MicroBatchLoss(NamedTuple):
    loss: torch.Tensor  # aggregated as algorithm.agg says, before the micro-batch's share
    metrics: dict[str, torch.Tensor]  # the loss's own (rlvr.algorithms.losses), and "kl" with the KL term
    is_weights: torch.Tensor | None  # π_old / π_sampler, truncated or masked (None: no correction)
    kept: torch.Tensor  # the tokens it trained on: the loss mask less those rejected as too far off policy


def padded(rows: list[torch.Tensor]) -> torch.Tensor:
    """Rows of different lengths as one `[rows, longest]` tensor, zeros after each row's end."""
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


def loss_mask(mb: MicroBatch, step: StepInput, device: torch.device) -> torch.Tensor:
    """`[sequences, tokens]`: the completion tokens the loss trains on."""
    mask = padded([torch.ones(c) for _, c in mb.spans]).bool()
    if step.loss_masks is not None:
        mask = mask & padded([torch.tensor(step.loss_masks[i]) for i in mb.sequences]).bool()
    return mask.to(device)


def sampler_logprobs(mb: MicroBatch, step: StepInput, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`[sequences, tokens]`: the logprob of each completion token under the policy that sampled it."""
    return padded([torch.tensor(step.sampler_logprobs[i], dtype=dtype) for i in mb.sequences]).to(device)


def micro_batch_loss(
    algo: AlgorithmConfig,
    lp: torch.Tensor,
    old: torch.Tensor,
    sampler: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    max_len: int,
    reference: Callable[[], torch.Tensor],
) -> MicroBatchLoss:
    """The policy loss of one micro-batch (plus the KL term against `reference()`, the reference
    model's logprobs, read only when the KL term is on)."""
    # The tokens were drawn by the sampler (policy versions behind under max_staleness, each
    # token's logprob from the version that drew it), not by π_old: IS reweights them by
    # π_old / π_sampler, truncated or masked (Yao et al. 2025; AReaL's decoupled PPO: the clip
    # stays around π_old, the behaviour policy only weights), and rejection drops the farthest.
    is_weights = None
    if algo.masked_is:
        kept_band = algo.masked_is
        is_weights = masked_is_weights(
            old, sampler, mask, low=kept_band.low, high=kept_band.high, level=kept_band.level
        )
    elif algo.tis_cap:
        is_weights = truncated_is_weights(old, sampler, mask, cap=algo.tis_cap, level=algo.tis_level)
    if algo.rejection:
        band = algo.rejection
        mask = off_policy_keep_mask(old, sampler, mask, low=band.low, high=band.high, level=band.level)
    loss, metrics = policy_loss(
        algo.loss,
        lp,
        old,
        adv,
        mask,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        dual_clip=algo.dual_clip,
        sapo_tau_pos=algo.sapo_tau_pos,
        sapo_tau_neg=algo.sapo_tau_neg,
        dppo_delta=algo.dppo_delta,
        agg=algo.agg,
        max_len=max_len,
        is_weights=is_weights,
    )
    if algo.kl and algo.kl_coef > 0:  # algo.kl_term, spelled out for the type checker
        kl = aggregate(kl_penalty(algo.kl, lp, reference()), mask, algo.agg, max_len)
        loss = loss + algo.kl_coef * kl
        metrics = {**metrics, "kl": kl.detach()}  # read as float(metrics["kl"]), as the loss's own
    return MicroBatchLoss(loss, metrics, is_weights, mask)


def record_micro_batch(
    report: TrainReport,
    algo: AlgorithmConfig,
    trained: MicroBatchLoss,
    share: tuple[float, float],
    mask: torch.Tensor,
    entropy: torch.Tensor,
    old: torch.Tensor,
    sampler: torch.Tensor,
) -> None:
    """Add a trained micro-batch to the rank's report: its share of the update's loss (`update_share`'s
    weight and denominator), and the per-token sums over the completion tokens of `mask` (rejected
    ones included: the entropy, the π_old/sampler gap and the corrections say what the policy did on
    every sampled token)."""
    weight, denominator = share
    tokens = mask.sum().item()
    report.loss += trained.loss.item() * weight / denominator
    report.tokens += tokens
    report.entropy_sum += float((entropy * mask).sum())
    report.sampler_gap_sum += ((old - sampler).abs() * mask).sum().item()
    for key in ("clip_fraction", "approx_kl", "ratio_mean", "kl"):
        if key in trained.metrics:
            report.add_policy(key, float(trained.metrics[key]) * tokens)
    if trained.is_weights is not None:
        report.add_policy("is_weight", float(torch.where(mask, trained.is_weights, 0.0).sum()))
        # how often the correction acts: tokens whose weight it capped (TIS) or zeroed (masked IS)
        level = algo.masked_is.level if algo.masked_is else algo.tis_level
        report.add_policy(
            "is_corrected", float((mask & (trained.is_weights != importance_ratios(old, sampler, mask, level))).sum())
        )
    if algo.rejection is not None:
        report.add_policy("rejected", float((mask & ~trained.kept).sum()))


def update_share(agg: str, mask: torch.Tensor, mb: MicroBatch, mini: MiniBatch) -> tuple[float, float]:
    """The micro-batch's share of its update, as (weight, denominator): its aggregated loss
    times weight / denominator is its part of the update's (token means by tokens, sequence
    means by rows; sums simply add)."""
    if agg == "token_sum":
        return 1, 1
    if agg == "token_mean":
        return mask.sum().item(), mini.num_tokens
    return len(mb.sequences), mini.num_sequences


def k3_sum(old: torch.Tensor, new: torch.Tensor) -> float:
    """Sum over tokens of k3, the estimate of KL(π_old || π_new) from tokens π_old sampled."""
    return float(kl_penalty("k3", old, new).sum())
