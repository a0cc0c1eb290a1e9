"""Where a step's wall time goes: generate / score / train / sync / eval, as time/* metrics.

    timer = StepTimer()
    with timer("generate"):
        rollouts = engine.generate(...)
    with timer("score"):
        ...
    logger.log(step, {**timer.pop_metrics(), ...})   # {"time/generate": s, "time/score": s}

Sections of one name add up within a step (two generate calls give one total). Sections
must not nest: the report stacks the time/* series, which is only meaningful when they
are disjoint parts of the step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StepTimer:
    """Accumulates wall-clock seconds per named section until pop_metrics() hands them out."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._running: str | None = None

    @contextmanager
    def __call__(self, section: str) -> Iterator[None]:
        if self._running is not None:
            raise RuntimeError(f"timer section {section!r} started inside {self._running!r}; sections must not nest")
        self._running = section
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[section] = self._seconds.get(section, 0.0) + time.perf_counter() - start
            self._running = None

    def pop_metrics(self) -> dict[str, float]:
        """{"time/<section>": seconds} for the sections timed since the last pop; resets."""
        metrics = {f"time/{name}": seconds for name, seconds in self._seconds.items()}
        self._seconds = {}
        return metrics
