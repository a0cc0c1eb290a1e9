"""The sandboxed scoring pool: verifiers run in worker processes, each item under a time limit.

Rules:
- Workers are started once per pool with the `spawn` context (safe when the parent holds torch
  or CUDA; workers import `rlvr.rewards`, and torch only because `rlvr.records` imports it). Each caps its address space (RLIMIT_AS) at its
  size after imports plus `memory_limit_mb`, so a runaway allocation raises MemoryError there.
- Items travel in chunks (few pipe round-trips); a worker answers item by item, so the parent
  always knows which item is running.
- Time: a worker arms SIGALRM for `timeout_s` per item and reports status "timeout" itself when
  Python code runs long. Code that never returns to the interpreter (a huge integer power, a
  regex) is caught by the parent: a worker silent for `timeout_s + KILL_GRACE_S` is killed and
  replaced, its item gets "timeout", the rest of its chunk is handed out again.
- A worker that dies on its own (a segfault, an abort, a kill from outside the pool) is replaced
  and its running item retried once (on the next free worker): the death may be the machine's
  (the OOM killer, an operator), not the response's. Dying on its retry too costs the item status
  "error". Each death is one line through `log`. An exception inside a verifier is status
  "error" without a retry. Each worker leads its own process group, and a kill (timeout,
  `close`) takes the whole group: processes a custom reward started die with its worker. Every failure scores 0 and the batch goes on.
- Rows may name their own verifier; `options` apply to the pool's default verifier only. A
  built-in default verifier is built once in the parent first, so an unknown option or a bad
  value raises ValueError (naming the option) before any worker starts. Loading a verifier
  (importing a custom module) in a worker gets `STARTUP_TIMEOUT_S`. A verifier with
  `.score_batch` (a batched custom reward) gets a chunk's items in one call, with `timeout_s`
  per item in the call.
- After each `score()`, `item_seconds[i]` is how long item i held its worker (from the worker's
  previous message, or the hand-out of its chunk, to its answer or its kill), and `restarts`
  counts the workers killed and replaced so far.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from rlvr.process_names import SCORER, name_process
from rlvr.records import Score
from rlvr.rewards.equivalence import warm_up
from rlvr.rewards.verifiers import VERIFIERS, get_verifier

KILL_GRACE_S = 0.5
STARTUP_TIMEOUT_S = 120.0
_TIMEOUT = Score(0.0, "timeout", None)
_ERROR = Score(0.0, "error", None)


class _ItemTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so library `except Exception` blocks cannot eat it."""


def _on_alarm(signum, frame):
    raise _ItemTimeout


def _limit_memory(extra_mb: int) -> None:
    with open("/proc/self/statm") as f:
        size_bytes = int(f.read().split()[0]) * resource.getpagesize()
    limit = size_bytes + extra_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _run_timed(fn, seconds: float):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _worker_main(conn: Connection, default: str, options: dict, timeout_s: float, memory_limit_mb: int) -> None:
    # Imported here so the module itself stays cheap for the parent.

    os.setsid()  # its own process group: a kill takes any processes a custom reward started, too
    name_process(SCORER)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGALRM, _on_alarm)
    warm_up()
    _limit_memory(memory_limit_mb)
    verifiers: dict[str, object] = {}

    def verifier_for(name: str):
        if name not in verifiers:
            conn.send(("budget", STARTUP_TIMEOUT_S))  # importing a custom module may take a while
            try:
                verifiers[name] = get_verifier(name, **(options if name == default else {}))
            finally:
                conn.send(("budget", timeout_s))  # loaded: the item clock starts now
        return verifiers[name]

    conn.send("ready")
    while (chunk := conn.recv()) is not None:
        for name, group in _group_by_verifier(chunk):
            try:
                fn = verifier_for(name)
            except Exception:
                for _ in group:
                    conn.send(_ERROR)
                continue
            if hasattr(fn, "score_batch"):
                conn.send(("budget", timeout_s * len(group)))
                scores = _safe(
                    lambda: fn.score_batch([r for r, _ in group], [a for _, a in group]), timeout_s * len(group)
                )
                for s in scores if isinstance(scores, list) else [scores] * len(group):
                    conn.send(s)
                continue
            for response, answer in group:
                conn.send(_safe(lambda: fn(response, answer), timeout_s))


def _safe(fn, seconds: float):
    try:
        return _run_timed(fn, seconds)
    except _ItemTimeout:
        return _TIMEOUT
    except Exception:  # includes MemoryError from RLIMIT_AS
        return _ERROR


def _kill_group(worker: _Worker) -> None:
    """SIGKILL the worker's process group (the worker and every process it started)."""
    try:
        os.killpg(worker.process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no such group: gone already, or not yet made (a worker still starting)
    worker.process.kill()


def _group_by_verifier(chunk: list[tuple[str, str, str]]):
    """Consecutive runs of items sharing a verifier, as (name, [(response, answer), ...])."""
    run: list[tuple[str, str]] = []
    name = None
    for item_name, response, answer in chunk:
        if item_name != name and run:
            yield name, run
            run = []
        name = item_name
        run.append((response, answer))
    if run:
        yield name, run


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: Connection
    ready: bool = False
    chunk: list[int] = field(default_factory=list)  # item indices not yet answered
    deadline: float = 0.0
    item_started: float = 0.0  # when the worker began its current item, as far as the parent can tell


class ScoringPool:
    """Scores responses against references in sandboxed workers (rules in the module doc).

    >>> with ScoringPool("math", workers=2) as pool:
    ...     pool.score(["so \\\\boxed{1/2}"], ["\\\\frac{1}{2}"])[0].reward
    1.0
    """

    def __init__(
        self,
        verifier: str = "math",
        *,
        workers: int = 2,
        timeout_s: float = 2.0,
        memory_limit_mb: int = 1024,
        options: dict | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        if workers < 1 or timeout_s <= 0 or memory_limit_mb <= 0:
            raise ValueError("ScoringPool needs workers >= 1, timeout_s > 0 and memory_limit_mb > 0")

        if verifier in VERIFIERS:
            get_verifier(verifier, **(options or {}))  # a bad option fails here, in one line
        self.verifier = verifier
        self.timeout_s = timeout_s
        self._args = (verifier, dict(options or {}), timeout_s, memory_limit_mb)
        self._ctx = mp.get_context("spawn")
        self._workers = [self._start_worker() for _ in range(workers)]
        self._closed = False
        self._log = log
        self._retried: set[int] = set()  # the items of the current score() already retried after a worker death
        self.restarts = 0
        self.item_seconds: list[float] = []

    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main, args=(child_conn, *self._args), daemon=True)
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn, deadline=time.monotonic() + STARTUP_TIMEOUT_S)

    def _replace(self, worker: _Worker) -> _Worker:
        self.restarts += 1
        _kill_group(worker)
        worker.process.join()
        worker.conn.close()
        fresh = self._start_worker()
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def wait_ready(self) -> None:
        """Block until every worker has started (score() also waits when it must)."""
        while starting := [w for w in self._workers if not w.ready]:
            for conn in wait(
                [w.conn for w in starting], timeout=max(0.0, min(w.deadline for w in starting) - time.monotonic())
            ):
                worker = next(w for w in starting if w.conn is conn)
                self._receive(worker, [], deque())
            if any(not w.ready and time.monotonic() > w.deadline for w in starting):
                raise RuntimeError("scoring worker failed to start in time")

    def score(
        self,
        responses: list[str],
        answers: list[str],
        verifiers: list[str] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[Score]:
        """One Score per response, in order; `verifiers` overrides the verifier per row (None: the pool's).

        `progress` is called with the number of items settled (scored, timed out or failed)
        each time some are, so its calls add up to len(responses)."""
        if self._closed:
            raise RuntimeError("ScoringPool is closed")
        if len(responses) != len(answers) or (verifiers is not None and len(verifiers) != len(responses)):
            raise ValueError("responses, answers and verifiers must have the same length")
        names = [name or self.verifier for name in verifiers] if verifiers else [self.verifier] * len(responses)
        items = [(names[i], str(responses[i]), str(answers[i])) for i in range(len(responses))]
        results: list[Score | None] = [None] * len(items)
        self.item_seconds = [0.0] * len(items)
        self._retried = set()
        # Several chunks per worker keep both busy when item costs differ.
        size = max(1, min(64, -(-len(items) // (4 * len(self._workers)))))
        pending = deque(list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size))
        remaining = len(items)
        while remaining:
            for worker in self._workers:
                if worker.ready and not worker.chunk and pending:
                    worker.chunk = pending.popleft()
                    now = time.monotonic()
                    worker.item_started, worker.deadline = now, now + self.timeout_s + KILL_GRACE_S
                    try:
                        worker.conn.send([items[i] for i in worker.chunk])
                    except OSError:  # it died while idle: the chunk never started
                        pending.appendleft(worker.chunk)
                        worker.chunk = []
                        self._died(worker, results, pending)
            busy = [w for w in self._workers if w.chunk or not w.ready]
            now = time.monotonic()
            readable = wait([w.conn for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - now))
            settled = sum(self._receive(worker, results, pending) for worker in busy if worker.conn in readable)
            now = time.monotonic()
            for worker in list(self._workers):
                if (worker.chunk or not worker.ready) and now > worker.deadline and worker.conn not in readable:
                    settled += self._fail(worker, results, pending, _TIMEOUT)
            remaining -= settled
            if progress is not None and settled:
                progress(settled)
        return results

    def _receive(self, worker: _Worker, results: list, pending: deque) -> int:
        """Read one message from `worker`; returns how many items it settled."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            return self._died(worker, results, pending)
        if message == "ready":
            worker.ready = True
            return 0
        now = time.monotonic()
        if isinstance(message, tuple) and message[0] == "budget":
            worker.deadline = now + message[1] + KILL_GRACE_S
            worker.item_started = now
            return 0
        self._settle(worker, results, message, now)
        worker.deadline = now + self.timeout_s + KILL_GRACE_S
        return 1

    def _settle(self, worker: _Worker, results: list, outcome: Score, now: float) -> None:
        """`worker`'s running item gets `outcome`, and its time on the worker is recorded."""
        index = worker.chunk.pop(0)
        results[index] = outcome
        self.item_seconds[index] = now - worker.item_started
        worker.item_started = now

    def _died(self, worker: _Worker, results: list, pending: deque) -> int:
        """`worker` died on its own: replace it; its running item goes back to be retried, or,
        dying on its retry, gets "error". Returns how many items it settled."""
        if not worker.ready:
            raise RuntimeError(f"scoring worker failed to start (exit code {worker.process.exitcode})")
        worker.process.join(timeout=KILL_GRACE_S)  # its pipe closes a moment before it is reaped
        died = f"scoring worker (pid {worker.process.pid}) died (exit code {worker.process.exitcode})"
        running = worker.chunk[0] if worker.chunk else None
        if running is None:
            self._log(f"{died} while idle; replaced")
        elif running in self._retried:
            self._log(f"{died} retrying item {running}; the item scores status 'error'")
            return self._fail(worker, results, pending, _ERROR)
        else:
            self._retried.add(running)
            self._log(f"{died} scoring item {running}; replaced, the item is retried")
            pending.appendleft(worker.chunk)
            worker.chunk = []
        self._replace(worker)
        return 0

    def _fail(self, worker: _Worker, results: list, pending: deque, outcome: Score) -> int:
        """Kill and replace `worker`; its running item gets `outcome`, the rest go back."""
        if not worker.ready:
            raise RuntimeError(f"scoring worker failed to start (exit code {worker.process.exitcode})")
        settled = 0
        if worker.chunk:
            self._settle(worker, results, outcome, time.monotonic())
            settled = 1
        if worker.chunk:
            pending.appendleft(worker.chunk)
        self._replace(worker)
        return settled

    def close(self) -> None:
        """Stop the workers; the pool cannot score afterwards."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
        for worker in self._workers:
            worker.process.join(timeout=2.0)
            _kill_group(worker)  # the worker if it hangs, and whatever it left running
            worker.process.join()
            worker.conn.close()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
