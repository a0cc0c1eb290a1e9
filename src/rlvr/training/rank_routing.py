"""A mixture-of-experts policy's routing on a trainer rank, given the engine's routes with the step
(rlvr.models.routing): around a micro-batch's forward (and backward) they are replayed
(`trainer.routing_replay`) or the trainer's routers choose; and π_old's forward is measured both
ways, for the moe/ metrics that show what replay changes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rlvr.models.moe import MoELayer
from rlvr.models.routing import RoutingRecord, agreement_counts, expert_counts, replay_routing, row_routes
from rlvr.training.commands import StepInput
from rlvr.training.packing import MicroBatch, unpack
from rlvr.training.rank_loss import loss_mask, padded, sampler_logprobs
from rlvr.training.report import RoutingSums, TrainReport

# a row's recorded routes (None: an empty micro-batch), the record of the routers' own choices
Routing = tuple[torch.Tensor | None, RoutingRecord]


@dataclass(frozen=True)
class RankRouting:
    """How a rank's policy routes: its MoE `layers` (none: a dense model, which has nothing to
    route), the engine's routes replayed or not (`replay`, trainer.routing_replay)."""

    layers: list[MoELayer]
    replay: bool
    device: torch.device

    def __post_init__(self):
        if self.replay and not self.layers:
            raise ValueError("trainer.routing_replay: the policy has no mixture-of-experts layers to replay")

    @property
    def num_experts(self) -> int | None:
        return self.layers[0].num_experts if self.layers else None

    @contextmanager
    def routed(self, mb: MicroBatch, step: StepInput) -> Iterator[Routing | None]:
        """Around a micro-batch's forward (and backward) of an MoE policy given the engine's routes:
        replay them or let the routers choose; yields (the row's recorded routes, the record of the
        routers' own choices), or None without routes."""
        if self.num_experts is None or step.routes is None:
            yield None
            return
        recorded = row_routes(mb, step.routes)
        with replay_routing(self.layers, recorded if self.replay else None) as own:
            yield recorded, own

    def measure(
        self,
        forward: Callable[[], torch.Tensor],
        mb: MicroBatch,
        step: StepInput,
        routing: Routing,
        logprobs: torch.Tensor,
        report: TrainReport,
    ) -> None:
        """Add to `report` the moe/ metrics of one micro-batch's π_old forward (`logprobs`, routed as
        configured), at the positions that sampled a token: how often the trainer's routers chose the
        engine's experts, the experts' load, and the sampler gap with and without replay (the other
        from one more `forward` without gradient, on every rank: FSDP2's collectives need all ranks
        in it)."""
        recorded, own = routing
        with torch.no_grad(), replay_routing(self.layers, None if self.replay else recorded) as other_own:
            other = forward()
        if mb.is_empty or recorded is None or self.num_experts is None:  # routes come for MoE rows only
            return
        at = mb.score_positions
        # the routers' own choices in the forward without replay (under replay, a layer's own choice
        # would see the replayed choices of the layers before it)
        unreplayed = other_own if self.replay else own
        agreeing, compared = agreement_counts(unreplayed.stacked().cpu()[at], recorded[at])
        mask = loss_mask(mb, step, self.device)
        sampler = sampler_logprobs(mb, step, logprobs.dtype, self.device)
        with_replay, without = (logprobs, other) if self.replay else (other, logprobs)

        def gap(values: torch.Tensor) -> float:
            return float(((padded(unpack(values, mb)) - sampler).abs() * mask).sum())

        report.add_routing(
            RoutingSums(
                agreeing,
                compared,
                expert_counts(recorded[at], self.num_experts),
                gap(with_replay),
                gap(without),
                float(mask.sum()),
            )
        )
