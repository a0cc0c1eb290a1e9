"""The LoRA slots' bookkeeping (rlvr.engines.lora_slots): least recently used first, sparing the
adapters requests in flight need (tests/test_engines_vllm_lora_slots.py runs it in vLLM)."""

from __future__ import annotations

import pytest

from rlvr.engines.lora_slots import LoraSlots


def _slots(*versions: int) -> LoraSlots[str]:
    slots: LoraSlots[str] = LoraSlots(len(versions))
    for version in versions:
        slots.add(version, f"v{version}")
    return slots


def test_a_new_adapter_takes_the_least_recently_used_slot():
    slots = _slots(0, 1, 2)
    assert slots.use(0) == "v0"  # used: 1 is now the least recently used
    assert slots.make_room(needed=set(), operation="add_lora") == ["v1"]
    slots.add(3, "v3")
    assert slots.use(1) is None and [slots.use(v) for v in (0, 2, 3)] == ["v0", "v2", "v3"]


def test_an_adapter_a_request_in_flight_needs_keeps_its_slot():
    slots = _slots(0, 1, 2)
    assert slots.make_room(needed={0, 1}, operation="add_lora") == ["v2"]
    assert slots.make_room(needed={0, 1}, operation="add_lora") == []  # a slot is free already
    slots.add(5, "v5")
    with pytest.raises(RuntimeError, match="add_lora: all 3 LoRA slots hold adapters of requests in flight"):
        slots.make_room(needed={0, 1, 5}, operation="add_lora")
    with pytest.raises(RuntimeError, match="make_room first"):
        slots.add(6, "v6")
