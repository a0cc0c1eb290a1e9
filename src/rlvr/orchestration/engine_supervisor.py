"""An engine that outlives its process: a dead engine is rebuilt, re-synced, and the call retried.

    start = lambda: make_engine(folder, cfg.engine, dtype=cfg.model.dtype, seed=0)
    engine = EngineSupervisor(start, max_restarts=2, log=print)
    engine.update_lora(adapter)
    rollouts = engine.generate(prompts, n, sampling)   # survives a killed vLLM engine core

Only an engine in its own process can die alone (vLLM's engine core, `engine.in_process: false`,
the default on GPU); it then raises `EngineDied`. The supervisor remembers the last weights it
pushed, so the new engine serves exactly the policy the old one did (the same `policy_version`), and
a seeded generate call retried on it gives the same rollouts.

Requests submitted and not yet polled back are submitted again, as they were submitted, and run
from their prompts under the weights restored. What the dead engine had sampled for them is lost,
including a sample an update had split into tokens of an older version and a continuation (see
rlvr.engines.vllm_engine): the new engine samples it whole under the version it serves, so each
token still carries the version that drew it. A request never updated in flight gives the same
samples again when seeded; one that was gives a sample of the latest version alone.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence

import torch

from rlvr.engines.base import Engine, EngineDied
from rlvr.orchestration import RunStopped
from rlvr.records import LoraAdapter, Request, Rollout, Sampling


class EngineRestartsExhausted(RunStopped):
    """The engine died once more after `max_restarts` restarts; the run stops."""


class EngineSupervisor(Engine):
    def __init__(self, build: Callable[[], Engine], max_restarts: int, log=print):
        self._build, self.max_restarts, self._log = build, max_restarts, log
        self.restarts = 0
        self._engine = build()
        self.name = self._engine.name  # every engine `build` gives is the same backend
        # the version the engine samples with (a restarted one: the last pushed, restored), read
        # from it again after each push and restart: nothing else changes it
        self.policy_version = self._engine.policy_version
        self._restore: Callable[[Engine], None] | None = None  # pushes the last weights again
        self._in_flight: dict[Hashable, tuple[Request, dict]] = {}  # submitted, not yet polled back

    def generate(
        self, prompts: list[list[int]], n: int, sampling: Sampling | Sequence[Sampling], **options
    ) -> list[Rollout]:
        return self._retrying("generate", lambda engine: engine.generate(prompts, n, sampling, **options))

    def submit(self, requests: Sequence[Request], **options) -> None:
        self._retrying("submit", lambda engine: engine.submit(requests, **options))
        self._in_flight.update({r.key: (r, options) for r in requests})

    def poll(self) -> list[tuple[Hashable, list[Rollout]]]:
        """As the engine's; an engine that dies meanwhile is replaced and every request still in
        flight submitted again (seeded, they give the same samples)."""
        done = self._retrying("poll", lambda engine: engine.poll())
        for key, _ in done:
            self._in_flight.pop(key, None)
        return done

    @property
    def pending(self) -> int:
        return self._engine.pending

    def score(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        return self._retrying("score", lambda engine: engine.score(sequences, prompt_lens))

    def score_each(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[list[float]]]:
        return self._retrying("score", lambda engine: engine.score_each(sequences, prompt_lens))

    def update_lora(self, adapter: LoraAdapter) -> None:
        self._retrying("update_lora", lambda engine: engine.update_lora(adapter))
        self._restore = lambda engine: engine.update_lora(adapter)
        self.policy_version = self._engine.policy_version

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        tensors = list(named_tensors)  # kept: a new engine starts from the base weights
        self._retrying("update_weights", lambda engine: engine.update_weights(tensors, version))
        self._restore = lambda engine: engine.update_weights(tensors, version)
        self.policy_version = self._engine.policy_version

    def sleep(self) -> None:
        self._retrying("sleep", lambda engine: engine.sleep())

    def wake(self) -> None:
        self._retrying("wake", lambda engine: engine.wake())

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> EngineSupervisor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _retrying(self, operation: str, call: Callable[[Engine], object]):
        while True:
            try:
                return call(self._engine)
            except EngineDied as died:
                if self.restarts >= self.max_restarts:
                    raise EngineRestartsExhausted(
                        f"{died}; engine.max_restarts={self.max_restarts} restarts used up, the run stops"
                    ) from died
                self.restarts += 1
                self._log(
                    f"{died}; restarting the engine ({self.restarts}/{self.max_restarts}) and retrying {operation}"
                )
                self._restart()

    def _restart(self) -> None:
        self._engine.close()  # the dead engine's client side: sockets, monitor thread
        self._engine = self._build()
        if self._restore is not None:
            self._restore(self._engine)
        self.policy_version = self._engine.policy_version
        for request, options in self._in_flight.values():
            self._engine.submit([request], **options)
