"""Rollout engines: `make_engine(model, engine, seed=...)` returns an `Engine` for the typed
config sections, in this process or, given a `placement`, as a Ray actor behind the same
interface. Each backend reads the options of `EngineConfig` that mean something to it."""

from __future__ import annotations

from pathlib import Path

from rlvr.config import EngineConfig, ModelConfig
from rlvr.engines.base import Engine


def make_engine(
    model: ModelConfig,
    engine: EngineConfig,
    *,
    seed: int,
    lora_rank: int | None = None,
    sleep_mode: bool = False,
    placement=None,
) -> Engine:
    """Start `engine.backend` on `model.path` (a local HF folder; a 4-bit one is served as
    `served_model_path` says).

    `lora_rank`: the engine serves LoRA adapters of up to this rank (None: no adapters).
    `sleep_mode`: the engine may free its device memory between steps (GPU vLLM only).
    `placement`: None runs it here; a `rlvr.orchestration.ray_placement.RayCluster` runs it
    in an actor in the cluster's placement group (which calls this again, there)."""
    if placement is not None:
        return placement.engine(model, engine, seed=seed, lora_rank=lora_rank, sleep_mode=sleep_mode)
    served = model.model_copy(update={"path": served_model_path(model.path, native_nvfp4=engine.backend == "vllm")})
    if engine.backend == "vllm":
        from rlvr.engines.vllm_engine import VLLMEngine

        return VLLMEngine(served, engine, seed=seed, lora_rank=lora_rank, sleep_mode=sleep_mode)
    from rlvr.engines.hf_engine import HFEngine

    return HFEngine(served, engine, seed=seed)


def served_model_path(model_path: str, native_nvfp4: bool = True) -> str:
    """What the engine loads. An NVFP4 checkpoint runs natively where vLLM has NVFP4 kernels
    (CUDA, `native_nvfp4`); elsewhere, and for NF4 always (vLLM 0.32 has no bitsandbytes method),
    the engine gets the dequantized values, written once beside it, which are exactly the numbers
    the trainer's packed layers compute with. transformers' generate (native_nvfp4 False) reads
    no compressed-tensors checkpoint without that package, so it gets the dequantized view too."""
    import torch

    from rlvr.quant.checkpoint import is_quantized_checkpoint, quantized_format, write_dequantized_checkpoint

    if not is_quantized_checkpoint(model_path):
        return model_path
    if native_nvfp4 and torch.cuda.is_available() and quantized_format(model_path) == "nvfp4":
        return model_path
    view = Path(str(model_path).rstrip("/") + ".dequantized")
    if not (view / "model.safetensors").is_file():  # written last
        write_dequantized_checkpoint(model_path, view)
    return str(view)


__all__ = ["Engine", "make_engine", "served_model_path"]
