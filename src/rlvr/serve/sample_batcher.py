"""Sampling calls gathered into one engine batch per base: the cookbook sends a step's groups as
concurrent calls, which one by one would each wait for the engine to run a few sequences, and the
models of several tenants on one base share its engine (rlvr.serve.base_host), whose batch takes
their adapters side by side where it has LoRA slots.

    batcher.add(host, pending)     # a session's first call on the host queues that session's turn
    # ... on the worker thread, at the first such turn: every call waiting on the host, in one batch
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tinker import types

from rlvr.records import Sampling
from rlvr.serve.base_host import BaseHost
from rlvr.serve.model import ServedModel
from rlvr.serve.protocol import sample_response
from rlvr.serve.refusals import BadRequest
from rlvr.serve.registry import SamplerSession
from rlvr.serve.work_line import WorkLine, session_of


@dataclass
class PendingSample:
    request: types.SampleRequest
    prompt: list[int]  # the request's tokens, checked against the vocabulary
    sampler: SamplerSession
    sampling: Sampling
    future: concurrent.futures.Future


class SampleBatcher:
    def __init__(self, work: WorkLine, model: Callable[[str], ServedModel]):
        self._work = work
        self._model = model  # model id -> the model, if it is still served
        self._waiting: dict[BaseHost, list[PendingSample]] = {}  # calls waiting for their base's batch
        # (host, session) whose turn is queued: each session's calls wait no longer than its own turn
        self._turns: set[tuple[BaseHost, str]] = set()
        self._lock = threading.Lock()  # the routes add to a batch while the worker takes one

    def add(self, host: BaseHost, pending: PendingSample) -> None:
        assert pending.sampler.model_id is not None  # a sampler with no model has no host
        turn = (host, session_of(pending.sampler.model_id))
        with self._lock:
            self._waiting.setdefault(host, []).append(pending)
            first = turn not in self._turns
            self._turns.add(turn)
        if first:
            self._work.put(turn[1], lambda: self._run(turn))

    def _run(self, turn: tuple[BaseHost, str]) -> None:
        """Each call's samples are drawn as alone (its own seeds), all of them in one engine batch."""
        host = turn[0]
        with self._lock:
            self._turns.discard(turn)
            batch = [item for item in self._waiting.pop(host, []) if item.future.set_running_or_notify_cancel()]
        try:
            live, scored = [], {}
            for item in batch:
                try:
                    model = self._model(item.sampler.model_id or "")
                    if item.request.prompt_logprobs:
                        scored[id(item)] = model.prompt_logprobs(
                            item.sampler.adapter, item.prompt, item.request.prompt_logprobs_last_n
                        )
                    live.append(item)
                except BadRequest as error:  # a closed model, a bad prompt_logprobs_last_n: that call alone
                    item.future.set_exception(error)
            drawn = host.sample_many(
                [(item.sampler.adapter, item.prompt, item.request.num_samples, item.sampling) for item in live]
            )
            for item, rollouts in zip(live, drawn):
                item.future.set_result(sample_response(rollouts, scored.get(id(item))))
        except BaseException as error:  # reported to each client through retrieve_future
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
