"""Where a run's rollouts come from, and the one way its policies reach the engine: a rollout
source. The loop asks it for each step's rollouts, lets it generate ahead while the ranks train,
and hands it each new policy; what it must remember for an exact resume it says itself.

    source = make_source(mode, collector, engine, stream, timer)   # rlvr.orchestration.builders
    current = source.next(step)        # the rollouts that train `step`
    source.generate_ahead(step + 1)    # while the ranks train (generates_ahead only)
    source.push(policy)                # the trainer's new policy, version = its step
    source.drain()                     # nothing in flight (before the sync probe, a checkpoint)
    saved = source.state()             # what a checkpoint keeps; source.restore(...) on resume

Three sources, one per `rollout.mode`:

- `Synchronous`: a step's rollouts are generated under the policy pushed just before it, so the
  step's own sampler/trainer gap checks that push;
- `OneStepAhead`: step t+1's rollouts are generated while step t trains, under the policy before
  t's update. Not saved: a resumed run regenerates them from the same prompts, seed and adapter
  (the in-flight adapter, which the checkpoint keeps);
- `Streaming`: fully asynchronous, groups come from a stream (rlvr.rollout.async_groups) that
  keeps the engine generating across steps; pushes reach its samples mid-sequence. What it
  holds is data (its tokens came from several policy versions), saved as such once drained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlvr.checkpoint.peft_files import IN_FLIGHT_ADAPTER, load_adapter
from rlvr.engines.base import Engine, push_policy
from rlvr.records import LoraAdapter, Weights
from rlvr.rollout.async_groups import AsyncGroups
from rlvr.rollout.collect import RolloutCollector, StepRollouts
from rlvr.tracking.timing import StepTimer


@dataclass
class SavedRollouts:
    """What a checkpoint keeps of the rollouts, besides the trainer."""

    data_position: int  # the prompt sampler's position a resumed run draws from
    data: dict | None = None  # rollouts kept as data (fully asynchronous: the stream's and the batch taken ahead)
    in_flight_adapter: bool = False  # the adapter that generated the rollouts in flight is saved too


class RolloutSource(Protocol):
    generates_ahead: bool  # the next step's rollouts are generated while a step trains
    push_checked_by_next_step: (
        bool  # the next step trains on samples of the policy pushed last: its gap checks the push
    )
    # What it generated ahead goes into a checkpoint as data, so a stopping run still generates it,
    # as the uninterrupted run does; a source that regenerates it on resume may skip it then.
    checkpoints_generated_ahead: bool

    def next(self, step: int) -> StepRollouts: ...

    def generate_ahead(self, step: int) -> None: ...

    def push(self, policy: LoraAdapter | Weights) -> None: ...

    def drain(self) -> None: ...

    def push_used_unchecked(self, saving: bool) -> bool:
        """Whether a push is used before a step's sampler gap can check it (then the sync probe
        checks it), `saving` a checkpoint after it."""

    def state(self) -> SavedRollouts: ...

    def restore(
        self, checkpoint: Path, data: dict | None, step: int, last_step: int, serve: Callable[[LoraAdapter], None]
    ) -> None:
        """Continue after `step` from `checkpoint` (its saved rollout `data`, if any); `serve`
        puts an adapter on the engine until the next push."""


class Synchronous:
    """Each step's rollouts generated when the step asks, under the policy pushed last."""

    generates_ahead = False
    push_checked_by_next_step = True  # the next step trains on this push's samples: its sampler gap checks it
    checkpoints_generated_ahead = False

    def __init__(self, collector: RolloutCollector, engine: Engine):
        self.collector, self.engine = collector, engine

    def next(self, step: int) -> StepRollouts:
        return self.collector.collect(step)

    def generate_ahead(self, step: int) -> None:
        raise RuntimeError("a synchronous run does not generate ahead")

    def push(self, policy: LoraAdapter | Weights) -> None:
        push_policy(self.engine, policy)

    def drain(self) -> None:
        """Nothing outlives a step's generation."""

    def push_used_unchecked(self, saving: bool) -> bool:
        return False

    def state(self) -> SavedRollouts:
        return SavedRollouts(self.collector.sampler.position)

    def restore(
        self, checkpoint: Path, data: dict | None, step: int, last_step: int, serve: Callable[[LoraAdapter], None]
    ) -> None:
        """Nothing was in flight."""


class OneStepAhead(Synchronous):
    """Step t+1's rollouts generated while step t trains, by the policy served before t's update."""

    generates_ahead = True
    push_checked_by_next_step = False  # the rollouts generated ahead already used the push

    def __init__(self, collector: RolloutCollector, engine: Engine):
        super().__init__(collector, engine)
        self.pending: StepRollouts | None = None  # generated ahead, not yet trained

    def next(self, step: int) -> StepRollouts:
        current, self.pending = self.pending or self.collector.collect(step), None
        return current

    def generate_ahead(self, step: int) -> None:
        self.pending = self.collector.collect(step)

    def push_used_unchecked(self, saving: bool) -> bool:
        return True  # by the rollouts generated ahead, before any step trains on them

    def state(self) -> SavedRollouts:
        """The position before the rollouts generated ahead: a resumed run generates them again."""
        position = self.pending.data_position if self.pending is not None else self.collector.sampler.position
        return SavedRollouts(position, in_flight_adapter=True)

    def restore(
        self, checkpoint: Path, data: dict | None, step: int, last_step: int, serve: Callable[[LoraAdapter], None]
    ) -> None:
        """Regenerate exactly the rollouts the interrupted run had in flight: `serve` the adapter
        that generated them (the trainer's policy is pushed after), then collect them."""
        in_flight = checkpoint / IN_FLIGHT_ADAPTER
        if in_flight.is_dir() and step < last_step:
            serve(load_adapter(in_flight, version=0))
            self.pending = self.collector.collect(step + 1)


class Streaming(OneStepAhead):
    """Fully asynchronous: the stream keeps the engine generating across steps, and each push
    goes through it, to be served from its next engine step under the samples still running."""

    # Which version sampled each token of the groups taken ahead depends on where the pushes fell
    # among engine steps: a resumed run cannot sample them again, so it finds them saved.
    checkpoints_generated_ahead = True

    def __init__(self, collector: RolloutCollector, stream: AsyncGroups, timer: StepTimer):
        super().__init__(collector, stream.engine)
        self.stream, self.timer = stream, timer
        # with K = 0 every group is trained by the policy that generated it: nothing to generate ahead,
        # and each step's sampler gap checks the push before it, as synchronously
        self.generates_ahead = stream.max_staleness > 0
        self.push_checked_by_next_step = not self.generates_ahead

    def push(self, policy: LoraAdapter | Weights) -> None:
        self.stream.update(policy)

    def drain(self) -> None:
        with self.timer("drain"):
            self.stream.drain()

    def push_used_unchecked(self, saving: bool) -> bool:
        # The stream checks each push's version arrives, and the probe runs where the stream is
        # drained anyway: at a checkpoint.
        return saving

    def state(self) -> SavedRollouts:
        """Drained (the push's probe did it): what the stream holds, and the batch taken ahead."""
        return SavedRollouts(self.collector.sampler.position, {"pending": self.pending, "stream": self.stream.state()})

    def restore(
        self, checkpoint: Path, data: dict | None, step: int, last_step: int, serve: Callable[[LoraAdapter], None]
    ) -> None:
        if data is None:
            raise ValueError(
                f"{checkpoint}: no saved rollouts: the checkpoint was not written by a rollout.mode=async "
                "run; resume it with the mode it ran"
            )
        self.stream.restore(data["stream"])
        self.pending = data["pending"]


def make_source(
    mode: str, collector: RolloutCollector, engine: Engine, stream: AsyncGroups | None, timer: StepTimer
) -> RolloutSource:
    """The source of `rollout.mode` (async: `stream`, built by the caller)."""
    if mode == "async":
        assert stream is not None, "rollout.mode async: the caller builds the stream"
        return Streaming(collector, stream, timer)
    return OneStepAhead(collector, engine) if mode == "one_step_off" else Synchronous(collector, engine)
