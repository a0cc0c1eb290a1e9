"""The stale-weight check: after every sync, engine and trainer must agree on a fixed probe.

A weight sync that silently fails (an adapter cached under an old id, a rename that loads
nothing) leaves the engine sampling from old weights while training goes on; the only sign is
a gap between the engine's and the trainer's logprobs of the same tokens. This module
measures that gap and stops the run when it exceeds a threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlvr.engines.base import Engine

# (prompt token ids, completion token ids)
Probe = Sequence[tuple[list[int], list[int]]]
TrainerLogprobs = Callable[[list[list[int]], list[int]], list[list[float]]]


def logprob_gap(engine: Engine, trainer_logprobs_fn: TrainerLogprobs, probe: Probe) -> float:
    """Mean absolute difference between engine and trainer logprobs of the probe's completion tokens."""
    sequences = [list(prompt) + list(completion) for prompt, completion in probe]
    prompt_lens = [len(prompt) for prompt, _ in probe]
    engine_lp = engine.score(sequences, prompt_lens)
    trainer_lp = trainer_logprobs_fn(sequences, prompt_lens)
    diffs = [abs(a - b) for e, t in zip(engine_lp, trainer_lp, strict=True) for a, b in zip(e, t, strict=True)]
    if not diffs:
        raise ValueError("the sync probe has no completion tokens")
    return sum(diffs) / len(diffs)


class SyncCheck:
    """Raises when the engine's logprobs drift from the trainer's by more than `threshold`."""

    def __init__(self, threshold: float = 0.05):
        self.threshold = threshold

    def __call__(self, gap: float, step: int) -> float:
        """Check a gap measured after the sync of `step`; returns it for logging as `sync/logprob_gap`."""
        if not gap <= self.threshold:  # also catches NaN
            raise RuntimeError(
                f"sync/logprob_gap={gap:.3g} > {self.threshold:g} after step {step}: the engine did not "
                "receive the new weights (or computes them differently); stopping before training on stale rollouts"
            )
        return gap

    def measure(self, engine: Engine, trainer_logprobs_fn: TrainerLogprobs, probe: Probe, step: int) -> float:
        """Measure the gap on `probe` and check it."""
        return self(logprob_gap(engine, trainer_logprobs_fn, probe), step)
