"""Rollout engines: `make_engine(model, engine, seed=...)` returns an `Engine` for the typed
config sections, in this process or, given a `placement`, as a Ray actor behind the same
interface. Each backend reads the options of `EngineConfig` that mean something to it."""

from __future__ import annotations

from rlvr.config import EngineConfig, ModelConfig
from rlvr.engines.base import Engine, cpu_threads


def make_engine(
    model: ModelConfig,
    engine: EngineConfig,
    *,
    seed: int,
    lora_rank: int | None = None,
    max_loras: int = 1,
    sleep_mode: bool = False,
    placement=None,
) -> Engine:
    """Start `engine.backend` on `model.path` (a local HF folder; a 4-bit one is served as
    `served_model_path` says); `engine.replicas` of them behind one `ReplicatedEngine`.

    `lora_rank`: the engine serves LoRA adapters of up to this rank (None: no adapters), through
    vLLM's LoRA layers up to `max_loras` of them at once (`Engine.lora_slots`; merged: one).
    `sleep_mode`: the engine may free its device memory between steps (GPU vLLM only).
    `placement`: None runs it here; a `rlvr.orchestration.ray_placement.RayCluster` runs each
    replica in an actor of the cluster's placement group (which calls this again, there)."""
    from rlvr.engines.replicas import ReplicatedEngine, replica_seed, unplaceable

    why = unplaceable(engine, on_ray=placement is not None)
    if why:
        raise ValueError(why)
    one = engine.model_copy(update={"replicas": 1})
    seeds = [replica_seed(seed, i) for i in range(engine.replicas)]
    if placement is not None:
        engines = placement.engines(
            model, one, seeds=seeds, lora_rank=lora_rank, max_loras=max_loras, sleep_mode=sleep_mode
        )
    else:
        engines = []
        try:
            for each_seed in seeds:
                engines.append(
                    _start_here(
                        model, one, seed=each_seed, lora_rank=lora_rank, max_loras=max_loras, sleep_mode=sleep_mode
                    )
                )
        except BaseException:
            for started in engines:
                started.close()
            raise
    return engines[0] if len(engines) == 1 else ReplicatedEngine(engines)


def _start_here(
    model: ModelConfig, engine: EngineConfig, *, seed: int, lora_rank: int | None, max_loras: int, sleep_mode: bool
) -> Engine:
    served = model.model_copy(update={"path": served_model_path(model.path, native_nvfp4=engine.backend == "vllm")})
    if engine.backend == "vllm":
        from rlvr.engines.vllm_engine import VLLMEngine

        return VLLMEngine(served, engine, seed=seed, lora_rank=lora_rank, max_loras=max_loras, sleep_mode=sleep_mode)
    from rlvr.engines.hf_engine import HFEngine

    return HFEngine(served, engine, seed=seed)


def served_model_path(model_path: str, native_nvfp4: bool = True) -> str:
    """What the engine loads. An NVFP4 checkpoint runs natively where vLLM has NVFP4 kernels
    (CUDA, `native_nvfp4`); elsewhere, and for NF4 always (vLLM 0.32 has no bitsandbytes method),
    the engine gets the dequantized values, written once beside it, which are exactly the numbers
    the trainer's packed layers compute with. transformers' generate (native_nvfp4 False) reads
    no compressed-tensors checkpoint without that package, so it gets the dequantized view too.
    A checkpoint in Mistral's layout keeps it for vLLM (native_nvfp4): vLLM serves that layout as
    MistralLarge3ForCausalLM, the math the trainer's `mistral4` runs, while an HF `mistral4`
    folder would reach vLLM's generic Transformers backend (it has no Mistral4ForCausalLM), whose
    CPU MoE op takes no float32; transformers' generate gets the HF layout."""
    import torch

    from rlvr.models.folder import config_file, read_model_folder
    from rlvr.quant.checkpoint import dequantized_view
    from rlvr.quant.formats import is_quantized_checkpoint, quantized_format

    if not config_file(model_path).is_file():
        return model_path  # no model folder here: the engine's own load says so
    folder = read_model_folder(model_path)
    if not is_quantized_checkpoint(folder):
        return model_path
    if native_nvfp4 and torch.cuda.is_available() and quantized_format(folder) == "nvfp4":
        return model_path
    return str(dequantized_view(folder, layout="mistral" if native_nvfp4 and folder.mistral else "hf"))


__all__ = ["Engine", "cpu_threads", "make_engine", "served_model_path"]
