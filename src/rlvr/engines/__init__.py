"""Rollout engines: `make_engine("vllm" | "hf", model_path, **options)` returns an `Engine`,
in this process or, given a `placement`, as a Ray actor behind the same interface."""

from __future__ import annotations

from rlvr.engines.base import Engine

BACKENDS = ("vllm", "hf")

# Options of the vLLM engine that mean nothing to transformers' generate; make_engine drops
# them for "hf" so that one config serves both backends. Any other unknown option is an error.
_VLLM_ONLY_OPTIONS = {
    "max_model_len",
    "enable_lora",
    "max_lora_rank",
    "max_loras",
    "tensor_parallel_size",
    "kv_cache_gb",
    "gpu_memory_utilization",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "enforce_eager",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "enable_sleep_mode",
    "in_process",
}


def make_engine(backend: str, model_path: str, *, placement=None, **options) -> Engine:
    """Start the engine for `backend` on the model at `model_path` (a local HF folder).

    `placement`: None runs it here; a `rlvr.orchestration.ray_placement.RayCluster` runs it
    in an actor in the cluster's placement group."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown engine backend {backend!r}; known: {', '.join(BACKENDS)}")
    if placement is not None:
        return placement.engine(backend, model_path, **options)
    if backend == "vllm":
        from rlvr.engines.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, **options)
    from rlvr.engines.hf_engine import HFEngine

    return HFEngine(model_path, **{k: v for k, v in options.items() if k not in _VLLM_ONLY_OPTIONS})


__all__ = ["BACKENDS", "Engine", "make_engine"]
