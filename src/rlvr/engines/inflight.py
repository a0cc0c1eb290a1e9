"""Requests in flight across an update (rlvr.engines.vllm_engine), as `InFlight` keeps them for
the engine. Preempted in place, each
sample's tokens keep the version that sampled them (`Preempted`). Aborted mid-sequence ("abort and
continue"): the records the vLLM engine keeps for what runs and what it stitches, the continuation
each unfinished sample is resubmitted as, and the sample rebuilt from its tokens before the update
and its continuation's. Nothing here calls vLLM: the engine reads what its output processor saw
(rlvr.engines.vllm_replies) and hands it over as plain lists.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from rlvr.records import Request, Rollout

Decode = Callable[[list[int]], str]  # token ids -> text, special tokens skipped


class Partial(NamedTuple):
    """What one sample had sampled, as this process saw it, when an update aborted its request."""

    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    text: str  # vLLM's incremental text (requests with stop strings only; otherwise decoded at the end)

    def extended(self, ids: list[int], logprobs: list[float], version: int, text: str) -> Partial:
        """These tokens, sampled under `version`, after the ones already held."""
        return Partial(self.completion_ids + ids, self.logprobs + logprobs, self.versions + [version] * len(ids),
                       self.text + text)  # fmt: skip


NOTHING_YET = Partial([], [], [], "")


@dataclass
class Flight:
    """A request running in vLLM: one submitted, or one sample's continuation after an update aborted its request."""

    request: Request  # what vLLM runs: a continuation's prompt ends with its sample's tokens so far, and n is 1
    ignore_eos: bool
    origin: str | None = None  # a continuation: the vLLM id of the request as submitted
    index: int = 0  # a continuation: which of that request's samples it continues
    prefix: Partial | None = None  # a continuation: that sample's tokens before it


@dataclass
class Stitch:
    """A submitted request an update aborted: its samples finished so far, the rest running as continuations."""

    request: Request
    finished: dict[int, Rollout] = field(default_factory=dict)


@dataclass
class Preempted:
    """The requests in flight across updates that preempted them in place, per sample: the versions of
    the tokens it had sampled by then, and the version that finished it if it had."""

    sampled_before: dict[str, dict[int, list[int]]] = field(default_factory=dict)  # by vLLM request id
    finished_under: dict[str, dict[int, int]] = field(default_factory=dict)

    def tag(self, running: dict[tuple[str, int], int], pending: dict[str, Flight], version: int) -> None:
        """Before an update that preempts the `pending` requests: tag the tokens each running sample
        ((request id, index) -> tokens sampled so far) has sampled with `version`, which sampled them;
        a sample no longer running finished under `version` (it waits for its siblings)."""
        alive: dict[str, set[int]] = {}
        for (request_id, index), tokens in running.items():
            alive.setdefault(request_id, set()).add(index)
            tagged = self.sampled_before.setdefault(request_id, {}).setdefault(index, [])
            tagged += [version] * (tokens - len(tagged))
        for request_id, flight in pending.items():
            finished = self.finished_under.setdefault(request_id, {})
            for index in set(range(flight.request.n)) - alive.get(request_id, set()):
                finished.setdefault(index, version)

    def versions(self, request_id: str, index: int, tokens: int, version: int) -> list[int]:
        """The version of each of a finished sample's `tokens`; `version` serves now."""
        tagged = self.sampled_before.get(request_id, {}).get(index, [])
        last = self.finished_under.get(request_id, {}).get(index, version)
        return tagged + [last] * (tokens - len(tagged))

    def forget(self, request_id: str) -> None:
        """The request is done."""
        self.sampled_before.pop(request_id, None)
        self.finished_under.pop(request_id, None)


class InFlight:
    """What a vLLM engine runs, by vLLM request id: each request's `Flight`, the `Stitch` of each
    submitted request an update aborted, and the tags of the samples updates preempted in place."""

    def __init__(self) -> None:
        self.flights: dict[str, Flight] = {}  # running, not yet returned by the engine's poll
        self.stitches: dict[str, Stitch] = {}  # by the id they were submitted under
        self.preempted = Preempted()
        self._ids = itertools.count()

    def new_id(self) -> str:
        return f"rlvr-{next(self._ids)}"

    @property
    def requests(self) -> int:
        """Requests submitted and not yet returned (one an update aborted counts once, whatever runs for it)."""
        return sum(flight.origin is None for flight in self.flights.values()) + len(self.stitches)

    def adapters(self, policy: int | None) -> set[int]:
        """The adapter versions the requests running sample with; one that names none samples the
        `policy`'s (None: the policy is the model as loaded, no adapter)."""
        versions = (policy if f.request.adapter is None else f.request.adapter for f in self.flights.values())
        return {version for version in versions if version is not None}

    def take_policy_flights(self) -> dict[str, Flight]:
        """Remove the requests that sample with the policy (they name no adapter), which an update
        of it aborts, and return them."""
        taken = {key: flight for key, flight in self.flights.items() if flight.request.adapter is None}
        self.flights = {key: flight for key, flight in self.flights.items() if key not in taken}
        return taken

    def finish(
        self, request_id: str, flight: Flight, rollouts: list[Rollout], decode: Decode
    ) -> tuple[Hashable, list[Rollout]] | None:
        """vLLM's request `request_id` (`flight`, taken out of `flights`) ended with `rollouts`: the
        request as submitted, (its key, its rollouts), once every sample of it has ended."""
        self.preempted.forget(request_id)
        origin, prefix = flight.origin, flight.prefix
        if origin is None or prefix is None:  # a request as submitted (a continuation has both)
            return flight.request.key, rollouts
        stitch = self.stitches[origin]
        stitch.finished[flight.index] = stitched(stitch.request, prefix, rollouts[0], decode)
        if len(stitch.finished) < stitch.request.n:
            return None
        del self.stitches[origin]
        return stitch.request.key, [stitch.finished[i] for i in range(stitch.request.n)]


def continuation_seed(seed: int, version: int) -> int:
    """The seed a seeded sample continues with under policy `version`: a function of its own seed and
    the version only, so that a rerun continues it alike and each update draws afresh (63 bits, which
    torch's generators take)."""
    digest = hashlib.blake2b(f"{seed}:{version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def spanning_stop_end(text: str, boundary: int, stops: Iterable[str]) -> int | None:
    """Where the first stop string that starts before `boundary` and ends after it ends in `text`
    (None: none does). vLLM checks a request's stop strings over its own output only, so a
    continuation misses one that began in the tokens its prompt took over."""
    starts = {stop: text.find(stop, max(0, boundary - len(stop) + 1), boundary + len(stop) - 1) for stop in stops}
    return min((start + len(stop) for stop, start in starts.items() if start != -1), default=None)


def continuation(flight: Flight, submitted: Request, origin: str, sample: int, seen: Partial, version: int) -> Flight:
    """Sample `sample` of `submitted` (sent to vLLM as `origin`) going on from `seen` under `version`, as
    `flight` ran it: the same stop strings, what is left of max_tokens, its own seed moved on by the version."""
    sampling = flight.request.sampling
    own_seed = None if sampling.seed is None else sampling.seed + (0 if flight.origin else sample)
    request = Request(
        submitted.key,
        list(submitted.prompt) + seen.completion_ids,
        1,
        replace(
            sampling,
            max_tokens=submitted.sampling.max_tokens - len(seen.completion_ids),
            seed=None if own_seed is None else continuation_seed(own_seed, version),
        ),
    )
    return Flight(request, flight.ignore_eos, origin, sample, seen)


def aborted(
    flights: dict[str, Flight],
    stitches: dict[str, Stitch],
    finished: dict[tuple[str, int], Rollout],
    running: dict[tuple[str, int], Partial],
    version: int,
) -> list[Flight]:
    """What becomes of the samples of requests an update aborted (`flights`, by vLLM request id): a
    finished one (`finished`, by (request id, sample index)) joins the stitch of the request as
    submitted, in `stitches`; a running one (its tokens so far in `running`) goes on as a continuation
    under `version`, returned to submit once that version serves."""
    continuations = []
    for request_id, flight in flights.items():
        origin = flight.origin or request_id
        stitch = stitches.setdefault(origin, Stitch(flight.request))
        for index in range(flight.request.n):
            sample = flight.index if flight.origin else index  # its index in the request as submitted
            if (request_id, index) in finished:
                stitch.finished[sample] = finished[request_id, index]
                continue
            if (request_id, index) not in running:
                raise RuntimeError(f"vLLM request {request_id}: sample {index} is neither running nor finished")
            continuations.append(
                continuation(flight, stitch.request, origin, sample, running[request_id, index], version)
            )
    return continuations


def stitched(submitted: Request, prefix: Partial, rest: Rollout, decode: Decode) -> Rollout:
    """One sample of `submitted`, put back together from its tokens before an update (`prefix`) and
    its continuation's rollout (`rest`). A stop string across the seam ends it there: vLLM did not
    see it (see `spanning_stop_end`), and the continuation's tokens after it are dropped."""
    if rest.versions is None:
        raise ValueError("a continuation's rollout must carry the version of each of its tokens")
    ids, logprobs, versions = (
        prefix.completion_ids + rest.completion_ids,
        prefix.logprobs + rest.logprobs,
        prefix.versions + rest.versions,
    )
    finish_reason, routes = rest.finish_reason, rest.routes
    if not submitted.sampling.stop:
        text = decode(ids)
    else:
        text = prefix.text + rest.text
        end = spanning_stop_end(text, len(prefix.text), submitted.sampling.stop)
        if end is not None:
            kept = len(prefix.completion_ids) + tokens_spelling(
                decode, prefix.completion_ids, rest.completion_ids, end - len(prefix.text)
            )
            ids, logprobs, versions, text = ids[:kept], logprobs[:kept], versions[:kept], text[:end]
            finish_reason, routes = "stop", None if routes is None else routes[: len(submitted.prompt) + kept - 1]
    return Rollout(0, list(submitted.prompt), ids, logprobs, finish_reason, text, routes=routes, versions=versions)


def tokens_spelling(decode: Decode, before: list[int], after: list[int], chars: int) -> int:
    """How many of `after`'s tokens, following `before`, it takes to decode to at least `chars` more characters."""
    base = len(decode(before))
    return next((k for k in range(1, len(after)) if len(decode(before + after[:k])) - base >= chars), len(after))
