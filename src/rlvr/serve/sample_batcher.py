"""Sampling calls gathered into one engine batch per model: the cookbook sends a step's groups as
concurrent calls, which one by one would each wait for the engine to run a few sequences.

    batcher.add(model_id, pending)     # the first call of a batch queues the batch's turn
    # ... on the worker thread: every call that arrived before the turn came, in one batch
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tinker import types

from rlvr.records import Sampling
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
        self._waiting: dict[str, list[PendingSample]] = {}  # model id -> calls waiting for its batch
        self._lock = threading.Lock()  # the routes add to a batch while the worker takes one

    def add(self, model_id: str, pending: PendingSample) -> None:
        with self._lock:
            batch = self._waiting.setdefault(model_id, [])
            batch.append(pending)
            first = len(batch) == 1
        if first:
            self._work.put(session_of(model_id), lambda: self._run(model_id))

    def _run(self, model_id: str) -> None:
        """Each call's samples are drawn as alone (its own seeds), all of them in one engine batch."""
        with self._lock:
            batch = [item for item in self._waiting.pop(model_id, []) if item.future.set_running_or_notify_cancel()]
        try:
            model = self._model(model_id)
            scored = {}
            for item in batch:
                if item.request.prompt_logprobs:
                    try:
                        scored[id(item)] = model.prompt_logprobs(
                            item.sampler.adapter, item.prompt, item.request.prompt_logprobs_last_n
                        )
                    except BadRequest as error:
                        item.future.set_exception(error)
            live = [item for item in batch if not item.future.done()]
            drawn = model.sample_many(
                [(item.sampler.adapter, item.prompt, item.request.num_samples, item.sampling) for item in live]
            )
            for item, rollouts in zip(live, drawn):
                item.future.set_result(sample_response(rollouts, scored.get(id(item))))
        except BaseException as error:  # reported to each client through retrieve_future
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
