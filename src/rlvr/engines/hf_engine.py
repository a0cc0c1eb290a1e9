"""Rollouts from transformers' `generate`, for models or settings vLLM does not serve.

Same interface and logprob convention as the vLLM engine (see `Engine`): rows are batched
with left padding and a KV cache; the sampler's logprobs come from `output_scores`, which
are the logits after temperature and top-p, i.e. the distribution each token was drawn from.
For a mixture-of-experts model every rollout also carries the experts each router chose at
each of its positions (`Rollout.routes`), recorded during `generate` by rlvr.models.routing:
what the trainer replays with `trainer.routing_replay`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import replace

import torch

from rlvr.affinity import allowed_cores
from rlvr.config import EngineConfig
from rlvr.engines.base import Engine, completion_logprobs, cpu_threads, per_prompt
from rlvr.hardware import compute_dtype
from rlvr.models.folder import ModelFolder
from rlvr.models.moe import moe_layers
from rlvr.models.routing import compact_routes, record_routing
from rlvr.models.tokenizer import load_tokenizer
from rlvr.models.transformers_classes import causal_lm_from_pretrained
from rlvr.quant import peft_targets_as_given
from rlvr.quant.skeleton import Skeleton
from rlvr.records import FinishReason, LoraAdapter, Request, Rollout, Sampling


class HFEngine(Engine):
    """A transformers model in this process, configured by `EngineConfig`: it reads
    hf_batch_size (rows per `generate` call: a batch runs until its longest row ends, as
    batched HF generation does) and num_threads (CPU threads, default every core); the
    vLLM options mean nothing to it. `seed` seeds calls that bring no seed of their own."""

    name = "hf"  # what summary.json reports as the engine that ran

    def __init__(self, folder: ModelFolder, engine: EngineConfig, *, dtype: str, seed: int, device: str | None = None):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(engine, len(allowed_cores())))
        self.tokenizer = load_tokenizer(folder.path)
        self.model = _load_model(folder, compute_dtype(dtype, self.device.type).torch).to(self.device)
        self.model.eval()

        layers = moe_layers(self.model)
        self.num_experts = layers[0].num_experts if layers else None  # None: a dense model, no routes
        self.seed = seed
        self.batch_size = engine.hf_batch_size
        self._queue: list[tuple[Request, bool]] = []  # (request, ignore_eos)
        # what samples now: 0 the weights loaded, then each update's version (a poll generates whole
        # rows under one version: an update never lands mid-generation here)
        self.policy_version = 0
        self._closed = False

    # -- generation -------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: Sampling | Sequence[Sampling],
        *,
        ignore_eos: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[Rollout]:
        """Sample `n` completions per prompt; `sampling` may be one per prompt.

        One `generate` call serves rows that sample alike (temperature, top_p, top_k, stops, seed);
        only max_tokens may differ between prompts (each row is cut at its own). A matched stop
        string is kept in the text, as the vLLM engine does. `progress` is called with each
        finished batch's row count.
        """
        samplings = per_prompt(sampling, len(prompts))
        if len({replace(s, max_tokens=0) for s in samplings}) > 1:
            raise ValueError("the HF engine needs one temperature, top_p, top_k, stops and seed per generate call")
        rows = [(i, prompt, samplings[i].max_tokens) for i, prompt in enumerate(prompts) for _ in range(n)]
        rollouts = []
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            rollouts += self._generate_batch(batch, samplings[0], start // self.batch_size, ignore_eos)
            if progress is not None:
                progress(len(batch))
        return rollouts

    def submit(self, requests: Sequence[Request], *, ignore_eos: bool = False) -> None:
        """Queue requests; the next `poll` generates every queued one (transformers' generate has
        no continuous batching: a batch runs until its longest row ends)."""
        self._queue += [(request, ignore_eos) for request in requests]

    def poll(self) -> list[tuple[Hashable, list[Rollout]]]:
        """Generate every queued request: one batched call per kind of sampling (all but max_tokens
        and seed, with n and ignore_eos), seeded by its first request's seed."""
        queue, self._queue = self._queue, []
        kinds: dict[tuple, list[Request]] = {}
        for request, ignore_eos in queue:
            kind = replace(request.sampling, max_tokens=0, seed=None)
            kinds.setdefault((kind, request.n, ignore_eos), []).append(request)
        done = []
        for (_, n, ignore_eos), group in kinds.items():
            seed = group[0].sampling.seed
            rollouts = self.generate(
                [r.prompt for r in group], n, [replace(r.sampling, seed=seed) for r in group], ignore_eos=ignore_eos
            )
            done += [(r.key, rollouts[i * n : (i + 1) * n]) for i, r in enumerate(group)]
        return done

    @property
    def pending(self) -> int:
        return len(self._queue)

    @torch.no_grad()
    def _generate_batch(self, rows, sampling: Sampling, batch_index: int, ignore_eos: bool) -> list[Rollout]:
        self._check_open("generate")
        pad = self.tokenizer.pad_token_id
        eos = self.tokenizer.eos_token_id
        width = max(len(prompt) for _, prompt, _ in rows)
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for _, p, _ in rows], device=self.device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p, _ in rows], device=self.device)
        greedy = sampling.temperature == 0
        stop_ids = () if ignore_eos else tuple(t for t in (eos, *sampling.stop_token_ids) if t is not None)
        torch.manual_seed((self.seed if sampling.seed is None else sampling.seed) + batch_index)

        with record_routing(self.model) if self.num_experts else nullcontext() as record:
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max(m for _, _, m in rows),
                do_sample=not greedy,
                temperature=None if greedy else sampling.temperature,
                top_p=None if greedy else sampling.top_p,
                top_k=None if greedy or sampling.top_k <= 0 else sampling.top_k,
                stop_strings=list(sampling.stop) or None,
                tokenizer=self.tokenizer if sampling.stop else None,
                eos_token_id=list(stop_ids) or None,
                pad_token_id=pad,
                output_scores=True,
                return_dict_in_generate=True,
            )
        # [rows, positions fed (left padding, prompt, new tokens but the last), MoE layers, k]
        routes = (
            compact_routes(record.per_sequence(len(rows)).cpu(), self.num_experts)
            if self.num_experts and record is not None  # recorded exactly when the model has experts
            else None
        )
        new_tokens = out.sequences[:, width:]
        logprobs = torch.log_softmax(torch.stack(out.scores, dim=1).float(), dim=-1)
        logprobs = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        rollouts = []
        for row, (prompt_index, prompt, max_tokens) in enumerate(rows):
            ids = new_tokens[row, :max_tokens].tolist()
            length, finish = self._finish(ids, sampling.stop, stop_ids)
            ids = ids[:length]
            rollouts.append(
                Rollout(
                    prompt_index=prompt_index,
                    prompt_ids=list(prompt),
                    completion_ids=ids,
                    logprobs=logprobs[row, :length].tolist(),
                    finish_reason=finish,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    routes=None if routes is None else routes[row, width - len(prompt) : width + length - 1].clone(),
                    versions=[self.policy_version] * length,
                )
            )
        return rollouts

    def _finish(self, ids: list[int], stop: tuple[str, ...], stop_ids: tuple[int, ...]) -> tuple[int, FinishReason]:
        """Length of the completion (up to and including EOS, a stop token or a stop string) and why it ended."""
        ended_at = next((at + 1 for at, token in enumerate(ids) if token in stop_ids), None)
        if ended_at is not None:
            ids = ids[:ended_at]
        if stop:
            for length in range(1, len(ids) + 1):
                if any(s in self.tokenizer.decode(ids[:length]) for s in stop):
                    return length, "stop"
        return (ended_at, "stop") if ended_at is not None else (len(ids), "length")

    @torch.no_grad()
    def score(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """Raw logprobs of the tokens after each prompt (one right-padded forward per batch)."""
        self._check_open("score")
        scores = []
        for start in range(0, len(sequences), self.batch_size):
            batch = sequences[start : start + self.batch_size]
            width = max(len(s) for s in batch)
            ids = torch.tensor(
                [s + [self.tokenizer.pad_token_id] * (width - len(s)) for s in batch], device=self.device
            )
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch], device=self.device)
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            for row, seq in enumerate(batch):
                begin = prompt_lens[start + row]
                lp = completion_logprobs(logits[row, begin - 1 : len(seq) - 1], ids[row, begin : len(seq)])
                scores.append(lp.tolist())
        return scores

    # -- weight sync ------------------------------------------------------------------------

    def update_lora(self, adapter: LoraAdapter) -> None:
        """Wrap the model with PEFT on first use, then load the adapter's tensors."""
        from peft import PeftModel, get_peft_config, get_peft_model, set_peft_model_state_dict

        self._check_open("update_lora")
        if not isinstance(self.model, PeftModel):
            with peft_targets_as_given():  # the trainer's targets, also on MoE models (dense MLPs, shared experts)
                self.model = get_peft_model(self.model, get_peft_config(dict(adapter.config)))
            self.model.eval()
        result = set_peft_model_state_dict(self.model, adapter.tensors)
        unexpected = result.unexpected_keys  # type: ignore[attr-defined]  # peft annotates its return `namedtuple`: torch's _IncompatibleKeys
        if unexpected:
            raise ValueError(f"LoRA tensors the model has no place for: {unexpected[:3]}")
        self.policy_version = adapter.version

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Load transformers-named tensors into the base model; every name must exist."""
        self._check_open("update_weights")
        result = self.model.load_state_dict(dict(named_tensors), strict=False)
        if result.unexpected_keys:
            raise ValueError(f"weights the model has no parameter for: {result.unexpected_keys[:3]}")
        self.policy_version = self.policy_version + 1 if version is None else version

    # -- lifetime ---------------------------------------------------------------------------

    def sleep(self) -> None:
        """No-op: the model shares the process with the trainer and has no cache to drop."""

    def wake(self) -> None:
        """No-op, see `sleep`."""

    def close(self) -> None:
        self._closed = True
        self.model = None

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise RuntimeError(f"HF engine is closed: cannot {operation}")


def _load_model(folder: ModelFolder, dtype: torch.dtype):
    """transformers' own load of an HF folder; a folder in Mistral's layout as the trainer builds
    it (`Skeleton`: the config and names vLLM reads it with, rlvr.models.mistral_layout), which
    `from_pretrained` cannot read (no config.json)."""

    if not folder.mistral:
        return causal_lm_from_pretrained(str(folder.path), dtype=dtype)

    skeleton = Skeleton.from_checkpoint(folder, dtype)
    skeleton.keep_initialized(skeleton.model)
    skeleton.fill(skeleton.model, "cpu")
    return skeleton.model
