"""What a trainer rank reports of a train step, defined once: the rank fills a `TrainReport`, and
`step_metrics` adds the ranks' reports up into the step's metrics. A sum a rank does not fill
stays None and gives no metric; a name that is not a field is an error on the rank (slots), so
a metric cannot be added on one side only.

Sums are over the rank's trained tokens (summed over ranks, then divided by all ranks' tokens);
`grad_norm`, `skipped`, `updates` and `lr` are the same on every rank (rank 0's are read);
`seconds` is each rank's own compute, and the step takes the slowest's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from rlvr.models.routing import expert_load_max_over_mean

# the loss's own per-token metrics (rlvr.algorithms.losses) and the off-policy corrections' counts:
# reported as sums over tokens, each a policy/ metric when any rank reports it
POLICY_SUMS = ("clip_fraction", "approx_kl", "ratio_mean", "kl", "is_weight", "is_corrected", "rejected")


@dataclass(slots=True)
class OptimizerUpdate:
    """One optimizer step of a rank (the same on every rank)."""

    grad_norm: float  # before clipping
    skipped: bool  # the gradient was not finite: no update


@dataclass(slots=True)
class ForwardBackwardReport:
    """A rank's part of a summed-loss forward(-backward) (the Tinker API's forward_backward)."""

    logprobs: dict[int, torch.Tensor]  # datum index -> its targets' logprobs
    loss: float  # the loss summed over the rank's tokens


@dataclass(slots=True)
class RoutingSums:
    """An MoE policy's routing, measured on π_old's forward at the positions that sampled a token
    (rlvr.training.rank_routing, `RankRouting.measure`)."""

    agreeing: float = 0.0  # positions x layers where the trainer's routers chose the engine's experts
    compared: float = 0.0
    expert_counts: torch.Tensor | float = 0.0  # [layers, experts] tokens routed to each expert
    gap_replay: float = 0.0  # sum of |trainer - sampler| logprob with the engine's routes replayed
    gap_no_replay: float = 0.0  # ... with the trainer's routers choosing
    gap_tokens: float = 0.0

    def __add__(self, other: RoutingSums) -> RoutingSums:
        return RoutingSums(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def metrics(self) -> dict[str, float]:
        tokens = max(self.gap_tokens, 1.0)
        load = expert_load_max_over_mean(torch.as_tensor(self.expert_counts))
        return {
            "moe/routing_agreement": self.agreeing / max(self.compared, 1.0),
            "moe/sampler_trainer_gap_replay": self.gap_replay / tokens,
            "moe/sampler_trainer_gap_no_replay": self.gap_no_replay / tokens,
            "moe/expert_load_max_over_mean": float(load.max()),  # the busiest layer's
        } | {f"moe/expert_load_max_over_mean/layer{i}": float(v) for i, v in enumerate(load)}


@dataclass(slots=True)
class TrainReport:
    loss: float = 0.0  # the mean update's loss (this rank's part of it)
    tokens: float = 0.0
    entropy_sum: float = 0.0
    sampler_gap_sum: float = 0.0  # |π_old - sampler| logprob over trained tokens
    policy_sums: dict[str, float] = field(default_factory=dict)  # POLICY_SUMS name -> sum over tokens
    approx_kl_after_sum: float | None = None  # several updates: k3 of π_old against the policy after them
    approx_kl_after_tokens: float | None = None
    grad_norm: float = 0.0  # the updates' mean
    skipped: float = 0.0  # updates skipped (a non-finite gradient)
    updates: float = 0.0
    lr: float = 0.0
    seconds: float = 0.0
    routing: RoutingSums | None = None

    def add_policy(self, name: str, value: float) -> None:
        if name not in POLICY_SUMS:
            raise KeyError(f"{name}: not a policy sum ({', '.join(POLICY_SUMS)})")
        self.policy_sums[name] = self.policy_sums.get(name, 0.0) + value

    def add_routing(self, sums: RoutingSums) -> None:
        self.routing = (self.routing or RoutingSums()) + sums


def step_metrics(reports: list[TrainReport]) -> dict[str, float]:
    """The step's metrics from every rank's report: per-token metrics are means over every trained
    token of every update; loss and grad_norm are the mean update's; time/train the slowest rank's."""
    first = reports[0]
    tokens = max(sum(r.tokens for r in reports), 1.0)
    metrics = {
        "loss": sum(r.loss for r in reports),
        "grad_norm": first.grad_norm,
        "lr": first.lr,
        "skipped": first.skipped,
        "optimizer/steps": first.updates - first.skipped,
        "policy/entropy": sum(r.entropy_sum for r in reports) / tokens,
        "sync/sampler_trainer_gap": sum(r.sampler_gap_sum for r in reports) / tokens,
        "time/train": max(r.seconds for r in reports),
    }
    for name in POLICY_SUMS:
        reported = [r.policy_sums[name] for r in reports if name in r.policy_sums]
        if reported:
            metrics[f"policy/{name}"] = sum(reported) / tokens
    # several updates: how far they moved the policy from π_old (a rank reports the sum and its tokens together)
    kl_sums = [r.approx_kl_after_sum for r in reports if r.approx_kl_after_sum is not None]
    kl_tokens = [r.approx_kl_after_tokens for r in reports if r.approx_kl_after_tokens is not None]
    if kl_sums:
        metrics["policy/approx_kl"] = sum(kl_sums) / max(sum(kl_tokens), 1.0)
    routed = [r.routing for r in reports if r.routing is not None]  # a rank of empty micro-batches measures none
    if routed:
        total = routed[0]
        for sums in routed[1:]:
            total = total + sums
        metrics |= total.metrics()
    return metrics
