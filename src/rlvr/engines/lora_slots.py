"""Which adapters an engine's LoRA slots hold (vLLM's `max_loras`), by policy version, least
recently used first. A new adapter takes the slot of the least recently used one that no request
in flight needs: evicting one a running request samples with would make vLLM load it again from
its path, which an adapter pushed from memory does not have.

    slots = LoraSlots(4)
    held = slots.use(version)                      # its handle, now the most recently used (None: in no slot)
    for handle in slots.make_room(needed={3}):     # free one slot, sparing version 3
        ...remove handle from the engine
    slots.add(version, handle)

The handles are the engine's (vLLM's LoRARequest); nothing here calls it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

Handle = TypeVar("Handle")


class LoraSlots(Generic[Handle]):
    def __init__(self, count: int):
        self.count = count
        self._held: OrderedDict[int, Handle] = OrderedDict()  # by version, least recently used first

    def use(self, version: int) -> Handle | None:
        """The handle of the adapter of `version`, now the most recently used (None: in no slot)."""
        held = self._held.get(version)
        if held is not None:
            self._held.move_to_end(version)
        return held

    def make_room(self, needed: set[int], operation: str) -> list[Handle]:
        """Free a slot if none is free, evicting the least recently used adapter whose version is
        not `needed`; the handles evicted, for the engine to remove. Raises when every slot holds
        a needed one (`operation` names the call in the message)."""
        evicted = []
        while len(self._held) >= self.count:
            version = next((v for v in self._held if v not in needed), None)
            if version is None:
                raise RuntimeError(f"{operation}: all {self.count} LoRA slots hold adapters of requests in flight")
            evicted.append(self._held.pop(version))
        return evicted

    def add(self, version: int, handle: Handle) -> None:
        """Hold `handle` for `version` (after `make_room`), as the most recently used."""
        if len(self._held) >= self.count:
            raise RuntimeError(f"version {version}: all {self.count} LoRA slots are taken; make_room first")
        self._held[version] = handle
