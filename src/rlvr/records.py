"""Small records passed between the stages of one RL step.

prompts -> engine.generate -> Rollout -> verifier -> Score -> advantages -> trainer -> sync.
Each record is defined here once; stages import them, never redefine them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # scoring workers import these records and must not pay for torch
    import torch

FinishReason = Literal["stop", "length"]
ScoreStatus = Literal["ok", "no_answer", "timeout", "error"]


@dataclass(frozen=True)
class Problem:
    """One dataset row: a question whose answer a program can check."""

    id: str
    question: str  # the problem text, before any prompt template
    answer: str  # the reference answer the verifier compares with
    meta: dict = field(default_factory=dict)
    # The row's own chat messages (a verl/SkyRL `prompt`), sent as they are instead of a
    # template around `question` (which is then their last user message).
    messages: tuple[dict, ...] | None = None


@dataclass(frozen=True)
class Sampling:
    """How the engine samples. `seed` makes a generate call reproducible. A completion ends at
    EOS, at a `stop` string or at a `stop_token_ids` token (each kept in the completion);
    `top_k` -1 samples from the whole vocabulary."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Request:
    """`n` samples of one prompt for an engine's submit/poll; `key` names it in poll's answer.
    With a seed, the j-th sample draws with seed + j."""

    key: Hashable
    prompt: list[int]
    n: int
    sampling: Sampling
    # the version of an adapter the engine holds in a LoRA slot (Engine.add_lora) to sample with;
    # None: the policy the engine serves
    adapter: int | None = None


@dataclass
class Rollout:
    """One sampled completion of one prompt, as the sampler produced it."""

    prompt_index: int  # index of the prompt in the generate() call
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # the sampler's logprob of each completion token
    finish_reason: FinishReason
    text: str  # what the verifier reads: the completion, or a multi-turn trajectory's last turn
    reward: float | None = None  # an environment's own reward (None: the verifier's to give)
    transcript: str | None = None  # a multi-turn trajectory decoded whole: turns, tool calls, tool output
    turns: int = 1
    tool_calls: int = 0
    # MoE: the experts each router chose at every position the engine ran, `[len(prompt_ids) +
    # len(completion_ids) - 1, MoE layers, top-k]` (the last token is never fed back), as small
    # integers (rlvr.models.routing.compact_routes); None for a dense model or an engine that
    # does not record them
    routes: torch.Tensor | None = None
    # the policy version that sampled each completion token (the engine's `policy_version` then:
    # 0 the weights it loaded, then each update's); a rollout running across an update has two
    versions: list[int] | None = None


@dataclass(frozen=True)
class Score:
    """A verifier's judgement of one response."""

    reward: float
    status: ScoreStatus
    extracted: str | None = None  # the final answer the verifier read, for maj@k
    detail: str | None = None  # why, in a few words, where a verifier says (the code verifier: what failed, limits hit)


@dataclass
class LoraAdapter:
    """A LoRA adapter in memory, in PEFT's naming, ready to hand to an engine.

    `tensors` keys are PEFT state-dict names (`...q_proj.lora_A.weight`), `config` is the
    PEFT `LoraConfig` as a dict, `version` increases with every sync so engines never reuse
    a stale adapter under the same id.
    """

    tensors: dict[str, torch.Tensor]
    config: dict
    version: int

    def __reduce__(self):
        # Pickled (by Ray, for the engine's actor), each tensor goes as a numpy view of its bytes,
        # which pickle protocol 5 hands over out of band: Ray writes it into its object store once
        # and gives the reader a view of it there. torch's own reduction copies a tensor through
        # torch.save into the pickle, and back out of it, twice on each side. So tensors rebuilt
        # from Ray may be read-only memory: an engine copies what it keeps (rlvr.engines).
        tensors = {
            name: (str(t.dtype).removeprefix("torch."), tuple(t.shape), _bytes_of(t))
            for name, t in self.tensors.items()
        }
        return _rebuild_adapter, (tensors, self.config, self.version)


@dataclass
class Weights:
    """A model's full weights in memory (transformers names): a policy version to push to an engine
    whole, as full fine-tuning does."""

    tensors: dict[str, torch.Tensor]
    version: int


def _bytes_of(tensor: torch.Tensor):
    import torch

    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()


def _rebuild_adapter(tensors: dict, config: dict, version: int) -> LoraAdapter:
    import warnings

    import torch

    with warnings.catch_warnings():  # views of Ray's object store are not writable: meant, see above
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        rebuilt = {
            name: torch.from_numpy(data).view(getattr(torch, dtype)).view(shape)
            for name, (dtype, shape, data) in tensors.items()
        }
    return LoraAdapter(rebuilt, config, version)


@dataclass
class TrainBatch:
    """Scored rollouts of one step, flattened to sequences for the trainer."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    sampler_logprobs: list[list[float]]
    advantages: torch.Tensor  # [B], one per sequence
    group: torch.Tensor  # [B] int64, the prompt each sequence answers
    # per completion token, whether the loss trains on it (1) or not (0: a filtered response, an
    # observation inserted between turns); None: every completion token
    loss_mask: list[list[int]] | None = None
    # MoE: each sequence's Rollout.routes, for routing replay and its metrics; None: not recorded
    routes: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.completion_ids)
