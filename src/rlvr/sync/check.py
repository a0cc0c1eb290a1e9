"""The stale-weight check: after every sync, engine and trainer must agree on a fixed probe.

A weight sync that silently fails (an adapter cached under an old id, a rename that loads
nothing) leaves the engine sampling from old weights while training goes on; the only sign is
a gap between the engine's and the trainer's logprobs of the same tokens. This module
measures that gap and stops the run when it exceeds a threshold.
"""

from __future__ import annotations

from collections.abc import Sequence

# (prompt token ids, completion token ids)
Probe = Sequence[tuple[list[int], list[int]]]


def probe_inputs(probe: Probe) -> tuple[list[list[int]], list[int]]:
    """(sequences, prompt lengths) of the probe: each prompt followed by its completion."""
    return [list(prompt) + list(completion) for prompt, completion in probe], [len(prompt) for prompt, _ in probe]


def logprob_gap(engine_lp: list[list[float]], trainer_lp: list[list[float]]) -> float:
    """Mean absolute difference between engine and trainer logprobs of the probe's completion tokens."""
    diffs = [abs(a - b) for e, t in zip(engine_lp, trainer_lp, strict=True) for a, b in zip(e, t, strict=True)]
    if not diffs:
        raise ValueError("the sync probe has no completion tokens")
    return sum(diffs) / len(diffs)


class SyncCheck:
    """Raises when the engine's logprobs drift from the trainer's by more than `threshold`."""

    def __init__(self, threshold: float = 0.05):
        self.threshold = threshold

    def __call__(self, gap: float, step: int, name: str = "sync/logprob_gap") -> float:
        """Check a gap measured after the sync of `step`; returns it for logging as `name`."""
        if not gap <= self.threshold:  # also catches NaN
            raise RuntimeError(
                f"{name}={gap:.3g} > {self.threshold:g} after the sync of step {step}: the engine did not "
                "receive the new weights (or computes them differently); stopping the run"
            )
        return gap
