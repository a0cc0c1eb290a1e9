"""Which cores a process's threads may run on: pin them all to a set, read back where they may run.

    with pinned([0]): ...        # every thread of this process on core 0, as before afterwards
    pin_process([1])             # every thread, for the rest of the process's life
    process_cores()              # [0]: the cores any of this process's threads may run on

Linux keeps a CPU mask per thread, and a new thread inherits its creator's, so a mask set on the
main thread alone misses the threads started before it: torch's OpenMP pool, the tokenizer's, gloo's.
Every thread listed in /proc/self/task is set instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

_TASKS = "/proc/self/task"


def allowed_cores() -> list[int]:
    """The cores this process may run on (its cgroup's cpuset, taskset), in order."""
    return sorted(os.sched_getaffinity(0))


def pin_process(cores: Iterable[int]) -> None:
    """Every thread of this process, and every thread or process it starts later, on `cores`."""
    cores = set(cores)
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def process_cores() -> list[int]:
    """The cores any thread of this process may run on (the union of their masks)."""
    cores: set[int] = set()
    for tid in _threads():
        try:
            cores |= os.sched_getaffinity(tid)
        except ProcessLookupError:
            pass
    return sorted(cores)


@contextmanager
def pinned(cores: Iterable[int]) -> Iterator[None]:
    """This process on `cores` inside the block; on the cores it had before, after it."""
    before = os.sched_getaffinity(0)
    pin_process(cores)
    try:
        yield
    finally:
        pin_process(before)


def core_list(cores: Iterable[int]) -> str:
    """`0-3,6`: cores as Linux's Cpus_allowed_list and taskset write them."""
    spans: list[list[int]] = []
    for core in sorted(cores):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(_TASKS)]
    except FileNotFoundError:  # no /proc: the calling thread is all that can be reached
        return [0]


def rank_threads(cores: int, ranks: int) -> int:
    """Torch threads per rank where `ranks` ranks share `cores` cores: a thread per core, at least one each."""
    return max(1, cores // ranks)
