"""A `VLLMEngine` request in vLLM's terms and back: the SamplingParams a `Sampling` (or a score)
asks for, the rollouts (or prompt logprobs) read from vLLM's finished samples, and, for an update that lands while requests run,
what vLLM's output processor holds of each running or finished sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlvr.engines.inflight import NOTHING_YET, Decode, Flight, Partial, Preempted
from rlvr.models.routing import compact_routes
from rlvr.records import Request, Rollout, Sampling

Sample = tuple[str, int]  # (vLLM request id, sample index)


def sampling_params(sampling: Sampling, n: int, ignore_eos: bool):
    from vllm import SamplingParams  # vllm: only an engine that runs it imports it
    from vllm.sampling_params import RequestOutputKind

    # vLLM detokenizes every new token of every sample (and each logprob's token) only to
    # check stop strings; without any, the text is decoded once at the end, the same way
    # (special tokens skipped).
    detokenize = bool(sampling.stop)
    return SamplingParams(
        n=n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=sampling.max_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        include_stop_str_in_output=True,
        seed=sampling.seed,
        logprobs=0,  # the sampled token's own logprob only
        flat_logprobs=True,  # a few flat lists per sample instead of a dict per token
        ignore_eos=ignore_eos,
        detokenize=detokenize,
        output_kind=RequestOutputKind.FINAL_ONLY,  # only finished requests matter
    )


def scoring_params():
    """What `score` asks of vLLM: prompt logprobs (the tokens' own), one token sampled and dropped."""
    from vllm import SamplingParams  # vllm: only an engine that runs it imports it

    return SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)


def prompt_logprobs(outputs, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
    """Each sequence's logprobs after its prompt, from the outputs of `scoring_params` requests."""
    return [
        [output.prompt_logprobs[t][seq[t]].logprob for t in range(start, len(seq))]
        for seq, start, output in zip(sequences, prompt_lens, outputs, strict=True)
    ]


@dataclass(frozen=True)
class RolloutReader:
    """Reads vLLM's finished samples as rollouts."""

    decode: Decode
    moe_blocks: list[int] | None  # vLLM's routes have a row per decoder block; these blocks' rows are rlvr's
    num_experts: int

    def rollouts(self, request: Request, output, preempted: Preempted, version: int) -> list[Rollout]:
        """A finished request's samples, in order; `version` is the one that serves now."""
        samples = sorted(output.outputs, key=lambda c: c.index)
        return [self.rollout(request, output.request_id, sample, preempted, version) for sample in samples]

    def rollout(self, request: Request, request_id: str, sample, preempted: Preempted, version: int) -> Rollout:
        if sample.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM request {request_id} ended with {sample.finish_reason!r}")
        completion = list(sample.token_ids)
        # flat logprobs with logprobs=0: one entry per position, the sampled token's
        if sample.logprobs.token_ids != completion:
            raise RuntimeError(f"vLLM request {request_id}: logprobs do not follow the sampled tokens")
        detokenized = bool(request.sampling.stop)
        routes = None
        if self.moe_blocks is not None and sample.routed_experts is not None:  # [positions, decoder blocks, k]
            experts = torch.from_numpy(sample.routed_experts.astype("int64"))
            positions = len(request.prompt) + len(completion) - 1
            routes = compact_routes(experts[:positions, self.moe_blocks], self.num_experts)
        return Rollout(
            prompt_index=0,
            prompt_ids=list(request.prompt),
            completion_ids=completion,
            logprobs=list(sample.logprobs.logprobs),
            finish_reason=sample.finish_reason,
            text=sample.text if detokenized else self.decode(completion),
            routes=routes,
            versions=preempted.versions(request_id, sample.index, len(completion), version),
        )


def running_samples(processor, pending: dict[str, Flight]) -> dict[Sample, Any]:
    """The output processor's state of each sample of the `pending` requests that still runs."""
    return {
        (state.external_req_id, state.request_index): state
        for state in processor.request_states.values()
        if state.external_req_id in pending
    }


def sampled_so_far(processor, pending: dict[str, Flight]) -> dict[Sample, int]:
    """The tokens each running sample of the `pending` requests has sampled, as this process saw them."""
    return {key: state.detokenizer.num_output_tokens() for key, state in running_samples(processor, pending).items()}


def finished_samples(processor, pending: dict[str, Flight]) -> dict[Sample, Any]:
    """The finished samples of the `pending` requests whose siblings still run."""
    return {
        (parent.external_req_id, sample.index): sample
        for parent in processor.parent_requests.values()
        if parent.external_req_id in pending
        for sample in parent.output_aggregator
        if sample is not None
    }


def seen(flight: Flight, state, version: int) -> Partial:
    """A running sample's tokens as this process has seen them (`version` sampled them), after
    those it continues."""
    ids = list(state.detokenizer.output_token_ids)
    flat = state.logprobs_processor.logprobs  # FlatLogprobs, one entry per position (see RolloutReader)
    if flat.token_ids != ids:
        raise RuntimeError(f"vLLM request {state.external_req_id}: logprobs do not follow the sampled tokens")
    text = state.detokenizer.output_text if flight.request.sampling.stop else ""
    return (flight.prefix or NOTHING_YET).extended(ids, list(flat.logprobs), version, text)
