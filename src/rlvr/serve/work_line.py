"""The order requests' work runs in: one worker thread, each session's line in turn (FairQueue), and a
model's training calls in the order of their seq_id (the SDK sends forward_backward chunks in parallel).

    line.submit(tenant, work, session=sid)                 # -> the SDK's UntypedAPIFuture
    line.submit(tenant, work, model_id=mid, seq_id=3)      # runs after seq_ids 1 and 2 have
    line.skip(mid, 3)                                      # a refused call still takes its turn
"""

from __future__ import annotations

from collections.abc import Callable

from rlvr.serve.fair_queue import FairQueue, Say
from rlvr.serve.futures import FutureStore
from rlvr.serve.refusals import BadRequest
from rlvr.serve.tenants import Tenant


def session_of(some_id: str) -> str:
    """The session a model or sampling-session id belongs to (its first part: SESSION:train:N)."""
    return some_id.split(":", 1)[0]


class WorkLine:
    def __init__(self, futures: FutureStore, say: Say = print):
        self.futures = futures
        self.queue = FairQueue(say=say)
        self._next_seq: dict[str, int] = {}  # model id -> the seq_id its next training call must carry
        self._waiting: dict[
            str, dict[int, Callable[[], None] | None]
        ] = {}  # model id -> seq_id -> work (None: refused)

    def submit(
        self,
        tenant: Tenant,
        work: Callable[[], object],
        model_id: str | None = None,
        seq_id: int | None = None,
        *,
        session: str | None = None,
        **extra,
    ) -> dict:
        """Queue `work` in its session's line (a model's training calls by seq_id); the SDK's UntypedAPIFuture."""
        unblocks = False
        if model_id is not None and seq_id is not None:
            self._check_seq(model_id, seq_id)
            unblocks = seq_id == self._next_seq[model_id] and bool(self._waiting[model_id])
        # over a limit (429), the seq_id stays unused: the SDK sends the same call again later
        request_id, future = self.futures.new(tenant, unblocks=unblocks)

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as error:  # reported to the client through retrieve_future
                    future.set_exception(error)

        if model_id is None or seq_id is None:
            self.queue.put(session or session_of(model_id or ""), run)
        else:
            self._in_order(model_id, seq_id, run)
        return {"request_id": request_id, "model_id": model_id, **extra}

    def skip(self, model_id: str, seq_id: int) -> None:
        """A refused training call: it still takes its turn, so that the calls after it are not held forever."""
        self._check_seq(model_id, seq_id)
        self._in_order(model_id, seq_id, None)

    def _check_seq(self, model_id: str, seq_id: int) -> None:
        expected = self._next_seq.setdefault(model_id, 1)
        if seq_id < expected or seq_id in self._waiting.setdefault(model_id, {}):
            raise BadRequest(f"seq_id {seq_id} of model {model_id} was already used (the next is {expected})")

    def _in_order(self, model_id: str, seq_id: int, run: Callable[[], None] | None) -> None:
        waiting = self._waiting[model_id]
        waiting[seq_id] = run
        while self._next_seq[model_id] in waiting:
            ready = waiting.pop(self._next_seq[model_id])
            self._next_seq[model_id] += 1
            if ready is not None:
                self.queue.put(session_of(model_id), ready)

    def put(self, session: str, work: Callable[[], None]) -> None:
        """Work that answers no future of its own (a batch of sampling calls, a model closing)."""
        self.queue.put(session, work)

    def close(self) -> None:
        self.futures.cancel_all()
        self.queue.close()
