"""Work from several clients on one machine, taken in turn.

    queue = FairQueue()
    queue.put("session-a", work)      # work: a callable, run on the queue's one thread
    queue.close()                     # runs what is queued, then stops

One thread runs everything: the models share the device, and two models' steps at once would
only contend for it. Each owner (a client's session) has its own line; the thread takes one item
from each owner with work waiting, round after round. A client that queued a hundred calls delays
another client's next call by one call, not by a hundred: the fair share that Tinker's own
service promises each client of a shared pool, without a scheduler to tune.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

Say = Callable[[str], None]  # one line for the server's terminal


class FairQueue:
    def __init__(self, name: str = "rlvr-serve", say: Say = print):
        self._say = say
        self._lines: dict[str, deque[Callable[[], None]]] = {}  # insertion order is the order of turns
        self._changed = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, owner: str, work: Callable[[], None]) -> None:
        with self._changed:
            if self._closing:
                raise RuntimeError("the server is shutting down")
            self._lines.setdefault(owner, deque()).append(work)
            self._changed.notify()

    def waiting(self) -> dict[str, int]:
        """Items waiting, by owner."""
        with self._changed:
            return {owner: len(line) for owner, line in self._lines.items()}

    def _next(self) -> Callable[[], None] | None:
        with self._changed:
            while not self._lines and not self._closing:
                self._changed.wait()
            if not self._lines:
                return None
            owner = next(iter(self._lines))
            line = self._lines.pop(owner)
            work = line.popleft()
            if line:
                self._lines[owner] = line  # its next item waits for every other owner's turn
            return work

    def _run(self) -> None:
        while (work := self._next()) is not None:
            try:
                work()  # a request's work reports its outcome through its future
            except Exception as error:  # anything else (a model closing): said, and the others' work goes on
                self._say(f"rlvr serve: {type(error).__name__}: {error}")

    def close(self) -> None:
        """Run what is queued (cancelled futures return at once), then stop the thread."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join()
