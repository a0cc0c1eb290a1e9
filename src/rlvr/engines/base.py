"""The interface every rollout engine implements, whatever runs underneath.

The controller, eval and the stale-weight check talk to an `Engine` only: token ids in,
`Rollout`s out, weights pushed in from memory. Backends (vLLM, transformers) live in their
own modules and subclass this protocol so that they inherit the context-manager behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import replace
from typing import Protocol

import torch

from rlvr.config import EngineConfig
from rlvr.records import LoraAdapter, Request, Rollout, Sampling, Weights


class EngineDied(RuntimeError):
    """The engine's own process died; a new engine can take over (see EngineSupervisor)."""


class Engine(Protocol):
    """A generator of rollouts whose weights the trainer can replace between steps.

    Logprob convention, shared by all backends so the trainer can match it exactly:
    `Rollout.logprobs` are log-probabilities under the distribution the token was sampled
    from, i.e. `log_softmax(logits / temperature)` (top_p < 1 further renormalises over the
    nucleus); at temperature 0 (greedy) they are the raw `log_softmax(logits)`. `score`
    always returns raw (temperature 1) logprobs.
    """

    name: str  # the backend, for what a run reports: "vllm", "hf"
    policy_version: int = 0  # the version of the weights it serves: 0 as loaded, then each update's
    restarts: int = 0  # engines built again after one died (rlvr.orchestration.engine_supervisor counts them)
    # adapters held side by side, each sampling the requests that name its version (`add_lora`,
    # Request.adapter), several in one batch; 0: the engine serves one policy at a time
    lora_slots: int = 0

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: Sampling | Sequence[Sampling],
        *,
        ignore_eos: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[Rollout]:
        """Sample `n` completions per prompt (`sampling`: one, or one per prompt); `len(prompts) * n`
        rollouts, by prompt then sample.

        A seed makes the call reproducible: prompt i, sample j draws with seed `seed + i * n + j`,
        so equal prompts still get different samples. `ignore_eos` (benchmarks) makes every sample
        run to its max_tokens. `progress`, if given, is called with the number of samples
        finished, as they finish. Unless an engine batches otherwise, these are the requests
        `submit` and `poll` make, all at once."""
        samplings = per_prompt(sampling, len(prompts))
        requests = [
            Request(i, prompt, n, s if s.seed is None else replace(s, seed=s.seed + i * n))
            for i, (prompt, s) in enumerate(zip(prompts, samplings))
        ]
        self.submit(requests, ignore_eos=ignore_eos)
        finished: dict[Hashable, list[Rollout]] = {}
        while len(finished) < len(prompts):
            for key, rollouts in self.poll():
                finished[key] = rollouts
                if progress is not None:
                    progress(len(rollouts))
        return [replace(r, prompt_index=i) for i, request in enumerate(requests) for r in finished[request.key]]

    def submit(self, requests: Sequence[Request], *, ignore_eos: bool = False) -> None:
        """Queue requests (each `n` samples of its prompt, the j-th seeded by its sampling's seed +
        j); `poll` hands them back as they finish. Requests may be submitted between polls, so a
        multi-turn rollout sends a trajectory's next turn as soon as it is known."""
        ...

    def poll(self) -> list[tuple[Hashable, list[Rollout]]]:
        """Work until at least one submitted request finishes; (its key, its n rollouts) for each."""
        ...

    @property
    def pending(self) -> int:
        """Requests submitted and not yet returned by `poll`."""
        ...

    def score(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """Raw logprobs of each sequence's tokens after its prompt, under the current weights."""
        ...

    def score_each(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[list[float]]]:
        """`score` by every copy of the weights the engine serves from: one list per replica, where
        `score` splits the sequences between them. What checks a weight push (the sync probe) must
        see every replica's weights."""
        return [self.score(sequences, prompt_lens)]

    def update_lora(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` (PEFT naming, in memory) from the next generate call on."""
        ...

    def add_lora(self, adapter: LoraAdapter) -> None:
        """Hold `adapter` in a LoRA slot beside the others (an engine with `lora_slots`), for the
        requests that name its version; the policy served stays as it was."""
        raise RuntimeError(f"add_lora: the {self.name} engine serves one policy at a time (no LoRA slots)")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Replace base-model weights, given by their transformers parameter names; serve them as
        policy `version` (default: one more than now)."""
        ...

    def sleep(self) -> None:
        """Free the engine's memory while the trainer runs; a no-op where unsupported."""
        ...

    def wake(self) -> None:
        """Undo `sleep`; a no-op where unsupported."""
        ...

    def close(self) -> None:
        """Release the engine; safe to call more than once."""
        ...

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def per_prompt(sampling: Sampling | Sequence[Sampling], prompts: int) -> list[Sampling]:
    """`generate`'s sampling, one per prompt."""
    samplings = [sampling] * prompts if isinstance(sampling, Sampling) else list(sampling)
    if len(samplings) != prompts:
        raise ValueError(f"got {len(samplings)} samplings for {prompts} prompts")
    return samplings


def push_policy(engine: Engine, policy: LoraAdapter | Weights) -> None:
    """Serve `policy` from now on, as version `policy.version`: an adapter, or full weights."""
    if isinstance(policy, LoraAdapter):
        engine.update_lora(policy)
    else:
        engine.update_weights(policy.tensors.items(), version=policy.version)


def completion_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Logprob of each token in `tokens` [T] under the rows of `logits` [T, V], in float32."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def cpu_threads(engine: EngineConfig, cores: int) -> int:
    """The threads an engine computes with on CPU, given the `cores` it may run on: engine.num_threads;
    else vLLM takes half of them, at least one (it shares them with the trainer ranks and the
    verifiers, and its OpenMP threads spin-wait: see rlvr.engines.vllm_options), and transformers all of them."""
    if engine.num_threads:
        return engine.num_threads
    return max(1, cores // 2) if engine.backend == "vllm" else max(1, cores)
