"""The order training prompts are drawn in."""

from __future__ import annotations

import random


class EpochSampler:
    """Prompts in a seeded random order, epoch after epoch; `position` is all the state, so a
    checkpoint that records it resumes the exact sequence of prompts."""

    def __init__(self, size: int, seed: int, position: int = 0):
        self.size, self.seed, self.position = size, seed, position
        self._epoch_order: tuple[int, list[int]] | None = None  # the last epoch's order: one shuffle per epoch

    def take(self, count: int) -> list[int]:
        out = []
        for _ in range(count):
            epoch, offset = divmod(self.position, self.size)
            out.append(self._order(epoch)[offset])
            self.position += 1
        return out

    def drawn(self) -> set[int]:
        """The indices drawn so far, in any epoch."""
        epochs, offset = divmod(self.position, self.size)
        if epochs:
            return set(range(self.size))
        return set(self._order(0)[:offset])

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            order = list(range(self.size))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]
