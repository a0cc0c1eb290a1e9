"""Several engines behind one `Engine`: data-parallel replicas (`engine.replicas`), each a whole
engine of its own TP group with its own seed, for runs whose generation outlasts training.

    engine = ReplicatedEngine([make_engine(..., seed=replica_seed(seed, i)) for i in range(n)])

Work is split by prompt group: a request (the n samples of one prompt) goes whole to one
replica, so that prefix caching still shares the prompt between its samples. `submit` gives
each request to the replica with the fewest samples pending; `generate` and `score` cut their
lists into contiguous runs, one per replica, and shift each run's seeds by its offset, so that
the vLLM engine's own seeding (prompt i draws with seed + i x n) numbers prompts as one engine
would and the samples are the same. Results come back in the caller's order. Weight syncs,
sleep, wake and close go to every replica, side by side.

The replicas run in threads of this process, one each: a Ray actor's call waits on its actor,
and an in-process engine's kernels release the GIL. No replica is called while its own `poll`
runs: requests for a replica that is polling wait here until that poll returns.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from threading import Lock

import torch

from rlvr.config import EngineConfig
from rlvr.engines.base import Engine, per_prompt
from rlvr.records import LoraAdapter, Request, Rollout, Sampling


def replica_seed(seed: int, index: int) -> int:
    """Replica `index`'s engine seed (for requests that bring none): replica 0 keeps the run's."""
    return seed + index


def unplaceable(engine: EngineConfig, on_ray: bool) -> str | None:
    """Why `engine.replicas` engines cannot run here (one line), or None."""
    if engine.replicas > 1 and engine.backend == "vllm" and not on_ray:
        # In-process (the CPU default) a vLLM engine initialises torch.distributed and vLLM's
        # process-wide state in the controller, which several cannot share; an actor each can.
        return (
            f"engine.replicas={engine.replicas}: vLLM replicas run as Ray actors (placement.backend: ray); "
            "on placement.backend: local only engine.backend: hf runs several engines"
        )
    return None


def spans(count: int, parts: int) -> list[tuple[int, int]]:
    """`count` items cut into at most `parts` contiguous non-empty runs whose sizes differ by at
    most one (the first runs the longer), as (start, stop)."""
    size, extra = divmod(count, parts)
    runs, start = [], 0
    for part in range(parts):
        stop = start + size + (part < extra)
        if stop > start:
            runs.append((start, stop))
        start = stop
    return runs


def assign(loads: list[int], sizes: Sequence[int]) -> list[int]:
    """The replica each request of `sizes` samples goes to, in order: the one with the fewest
    samples pending at that moment (the lowest index on a tie). Updates `loads`."""
    chosen = []
    for size in sizes:
        replica = min(range(len(loads)), key=loads.__getitem__)
        loads[replica] += size
        chosen.append(replica)
    return chosen


class ReplicatedEngine(Engine):
    """N engines as one (see the module doc-string); `replicas` are started engines, owned here."""

    def __init__(self, replicas: Sequence[Engine]):
        if not replicas:
            raise ValueError("ReplicatedEngine needs at least one engine")
        self.replicas = list(replicas)
        self.name = self.replicas[0].name
        self._threads = ThreadPoolExecutor(len(self.replicas), thread_name_prefix="rlvr-replica")
        self._load = [0] * len(self.replicas)  # samples submitted to each and not yet polled back
        self._waiting: list[list[tuple[list[Request], dict]]] = [[] for _ in self.replicas]  # for a polling replica
        self._polling: dict[int, Future] = {}
        self._finished: list[tuple[Hashable, list[Rollout]]] = []  # polled back, not yet handed out
        self._pending = 0
        self._closed = False

    # -- generation -------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: Sampling | Sequence[Sampling],
        *,
        progress: Callable[[int], None] | None = None,
        **options,
    ) -> list[Rollout]:
        """As one engine's generate: the prompts in contiguous runs, one per replica, each run's
        seeds shifted by its offset x n; rollouts by prompt then sample, `prompt_index` global."""
        samplings = per_prompt(sampling, len(prompts))
        self._settle("generate")
        report = None if progress is None else one_at_a_time(progress)  # the replicas report from their threads

        def run(replica: Engine, start: int, stop: int) -> list[Rollout]:
            shifted = [s if s.seed is None else replace(s, seed=s.seed + start * n) for s in samplings[start:stop]]
            rollouts = replica.generate(prompts[start:stop], n, shifted, progress=report, **options)
            return [replace(r, prompt_index=r.prompt_index + start) for r in rollouts]

        runs = spans(len(prompts), len(self.replicas))
        return [
            r
            for part in self._together([(run, replica, *span) for replica, span in zip(self.replicas, runs)])
            for r in part
        ]

    def submit(self, requests: Sequence[Request], **options) -> None:
        """Each request, whole, to the replica with the fewest samples pending; a replica that is
        polling gets its requests once its poll returns."""
        self._check_open("submit")
        requests = list(requests)
        batches: dict[int, list[Request]] = {}
        for request, replica in zip(requests, assign(self._load, [r.n for r in requests])):
            batches.setdefault(replica, []).append(request)
        for replica, batch in batches.items():
            self._waiting[replica].append((batch, options))
            if replica not in self._polling:
                self._hand_over(replica)
        self._pending += len(requests)

    def poll(self) -> list[tuple[Hashable, list[Rollout]]]:
        """Poll every replica with work (each in its thread) until at least one request finishes;
        polls still running when this returns go on, and the next call collects them."""
        while not self._finished and self._pending:
            for replica, load in enumerate(self._load):
                if load and replica not in self._polling:
                    self._hand_over(replica)
                    self._polling[replica] = self._threads.submit(self.replicas[replica].poll)
            wait(self._polling.values(), return_when=FIRST_COMPLETED)
            self._collect()
        done, self._finished = self._finished, []
        self._pending -= len(done)
        return done

    @property
    def pending(self) -> int:
        return self._pending

    def _hand_over(self, replica: int) -> None:
        """Submit what waits for `replica` (which is not polling)."""
        waiting, self._waiting[replica] = self._waiting[replica], []
        for batch, options in waiting:
            self.replicas[replica].submit(batch, **options)

    def _collect(self, every: bool = False) -> None:
        """Take the results of the polls that returned (with `every`, wait for all of them first)."""
        if every:
            wait(self._polling.values())
        for replica, future in list(self._polling.items()):
            if future.done():
                del self._polling[replica]
                done = future.result()
                self._load[replica] -= sum(len(rollouts) for _, rollouts in done)
                self._finished += done

    def score(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """Each replica scores a contiguous run of the sequences."""
        self._settle("score")
        runs = spans(len(sequences), len(self.replicas))
        parts = self._together(
            [
                (lambda r, a, b: r.score(sequences[a:b], prompt_lens[a:b]), replica, *span)
                for replica, span in zip(self.replicas, runs)
            ]
        )
        return [scores for part in parts for scores in part]

    def score_each(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[list[float]]]:
        """Every replica scores every sequence (the sync probe: each replica's weights checked)."""
        self._settle("score")
        return self._together([(lambda r: r.score(sequences, prompt_lens), replica) for replica in self.replicas])

    # -- weight sync and lifetime: every replica --------------------------------------------

    def update_lora(self, adapter: LoraAdapter) -> None:
        self._each(lambda replica: replica.update_lora(adapter))
        self.policy_version = self._served_version()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        tensors = list(named_tensors)  # one pass for every replica
        self._each(lambda replica: replica.update_weights(tensors, version))
        self.policy_version = self._served_version()

    def _served_version(self) -> int:
        """The version every replica serves (each took the same update); the lowest if they differ,
        so that a push check sees a replica the update did not reach."""
        return min(replica.policy_version for replica in self.replicas)

    def sleep(self) -> None:
        self._each(lambda replica: replica.sleep())

    def wake(self) -> None:
        self._each(lambda replica: replica.wake())

    def close(self) -> None:
        """Close every replica (all of them, even when one fails to close); safe to call again."""
        if self._closed:
            return
        self._closed = True
        wait(self._polling.values())  # a replica is never closed under its own running poll
        self._polling.clear()
        try:
            self._together([(lambda replica: replica.close(), replica) for replica in self.replicas])
        finally:
            self._threads.shutdown()

    def _each(self, call: Callable[[Engine], None]) -> None:
        """`call` on every replica side by side."""
        self._settle("reach its replicas")
        self._together([(call, replica) for replica in self.replicas])

    def _together(self, calls: list[tuple]) -> list:
        """Each (function, *args) in its own thread; their results in order, once all returned
        (the first failure raised then)."""
        futures = [self._threads.submit(*call) for call in calls]
        wait(futures)
        return [future.result() for future in futures]

    def _settle(self, operation: str) -> None:
        """Wait for the polls still running (their results kept for `poll`): a replica takes one call at a time."""
        self._check_open(operation)
        self._collect(every=True)

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise RuntimeError(f"the engine replicas are closed: cannot {operation}")


def one_at_a_time(fn: Callable[[int], None]) -> Callable[[int], None]:
    """`fn`, called from several threads, run by one of them at a time."""
    lock = Lock()

    def call(value: int) -> None:
        with lock:
            fn(value)

    return call
