"""Every accepted request's future, held for the tenant that made it: what `retrieve_future` answers.

    request_id, future = futures.new(tenant, tokens=n)   # OverLimit (429) past the tenant's limits
    await futures.answer(request_id, tenant)             # the result, or try_again after a held poll

A tenant's requests not yet answered count against its `queued_requests`, and its sampling calls'
tokens against `sampling_tokens`, from acceptance until the future is done: the limits hold what a
tenant can make the one worker thread and the engine owe it at once. Request ids are random: another
tenant's id is as unknown as one never issued (NotFound).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from fastapi.responses import JSONResponse, Response

from rlvr.serve.refusals import BadRequest, NotFound, OverLimit
from rlvr.serve.tenants import Tenant

# The SDK waits 45 s for each retrieve_future answer; holding a poll for less keeps it under that.
HOLD_S = 30.0
# A result stays retrievable this long after it is done (the SDK retrieves at once, and again only
# when a poll was lost), then is forgotten.
KEEP_S = 600.0
PROTOBUF = "application/x-protobuf"


@dataclass
class _Held:
    tenant: str
    future: concurrent.futures.Future
    tokens: int
    done_at: float | None = None


class FutureStore:
    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()  # futures finish on the worker thread, requests arrive on the server's
        self._open: Counter[str] = Counter()  # tenant -> its requests not yet done
        self._tokens: Counter[str] = Counter()  # tenant -> sampling tokens of its requests not yet done

    def new(self, tenant: Tenant, tokens: int = 0, unblocks: bool = False) -> tuple[str, concurrent.futures.Future]:
        """A new request's future, if the tenant's limits leave room for it. A call that `unblocks`
        others (the training call their seq_ids wait for) is taken over the queue limit: refusing it
        would hold them, and so the queue, forever."""
        limits = tenant.limits
        with self._lock:
            self._forget_old(time.monotonic())
            if self._open[tenant.name] >= limits.queued_requests and not unblocks:
                raise OverLimit(
                    f"limits.queued_requests: tenant {tenant.name} has {self._open[tenant.name]} requests unanswered "
                    f"(limit {limits.queued_requests}); retrieve their results first"
                )
            if tokens and self._tokens[tenant.name] + tokens > limits.sampling_tokens:
                raise OverLimit(
                    f"limits.sampling_tokens: this call's {tokens} tokens (num_samples x (prompt + max_tokens)) and "
                    f"the {self._tokens[tenant.name]} in flight pass tenant {tenant.name}'s {limits.sampling_tokens}"
                )
            request_id = f"req-{uuid.uuid4().hex}"
            future: concurrent.futures.Future = concurrent.futures.Future()
            held = _Held(tenant.name, future, tokens)
            self._held[request_id] = held
            self._open[tenant.name] += 1
            self._tokens[tenant.name] += tokens
        future.add_done_callback(lambda _: self._done(held))
        return request_id, future

    def _done(self, held: _Held) -> None:
        with self._lock:
            held.done_at = time.monotonic()
            self._open[held.tenant] -= 1
            self._tokens[held.tenant] -= held.tokens

    def _forget_old(self, now: float) -> None:
        for request_id in [rid for rid, h in self._held.items() if h.done_at is not None and now - h.done_at > KEEP_S]:
            del self._held[request_id]

    def get(self, request_id: str, tenant: Tenant) -> concurrent.futures.Future:
        held = self._held.get(request_id)
        if held is None or held.tenant != tenant.name:
            raise NotFound(f"unknown request_id {request_id!r}")
        return held.future

    async def answer(self, request_id: str, tenant: Tenant) -> Response:
        """The request's result once it is there; after HOLD_S without one, try_again (the work goes on)."""
        future = self.get(request_id, tenant)
        waited = asyncio.wrap_future(future)
        # the outcome is read from `future`; marking the copy's as read keeps asyncio from logging it as lost
        waited.add_done_callback(lambda copy: copy.cancelled() or copy.exception())
        done, _ = await asyncio.wait([waited], timeout=HOLD_S)  # never cancels the work
        if not done:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        error = future.exception()
        if error is not None:
            user = isinstance(error, (BadRequest, ValueError)) or getattr(error, "user_error", False)
            return JSONResponse({"error": f"{type(error).__name__}: {error}", "category": "user" if user else "server"})
        result = future.result()
        if isinstance(result, bytes):
            return Response(result, media_type=PROTOBUF)
        return JSONResponse(result)

    def cancel_all(self) -> None:
        """Cancel what has not started (the server is closing)."""
        for held in list(self._held.values()):
            held.future.cancel()
