"""Rollout engines: `make_engine(folder, engine, dtype=..., seed=...)` returns an `Engine` for the
model folder the run opened and its typed engine section, in this process or, given a
`placement`, as a Ray actor behind the same interface. Each backend reads the options of
`EngineConfig` that mean something to it."""

from __future__ import annotations

from rlvr.config import EngineConfig
from rlvr.engines.base import Engine, cpu_threads
from rlvr.models.folder import ModelFolder, read_model_folder


def make_engine(
    folder: ModelFolder,
    engine: EngineConfig,
    *,
    dtype: str,
    seed: int,
    lora_rank: int | None = None,
    max_loras: int = 1,
    sleep_mode: bool = False,
    placement=None,
) -> Engine:
    """Start `engine.backend` on the model `folder` (a 4-bit one is served as `served_folder`
    says), computing in `dtype` (model.dtype); `engine.replicas` of them behind one `ReplicatedEngine`.

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
            folder, one, dtype=dtype, seeds=seeds, lora_rank=lora_rank, max_loras=max_loras, sleep_mode=sleep_mode
        )
    else:
        engines = []
        try:
            for each_seed in seeds:
                engines.append(
                    _start_here(
                        folder,
                        one,
                        dtype=dtype,
                        seed=each_seed,
                        lora_rank=lora_rank,
                        max_loras=max_loras,
                        sleep_mode=sleep_mode,
                    )
                )
        except BaseException:
            for started in engines:
                started.close()
            raise
    return engines[0] if len(engines) == 1 else ReplicatedEngine(engines)


def _start_here(
    folder: ModelFolder,
    engine: EngineConfig,
    *,
    dtype: str,
    seed: int,
    lora_rank: int | None,
    max_loras: int,
    sleep_mode: bool,
) -> Engine:
    served = served_folder(folder, native_nvfp4=engine.backend == "vllm")
    if engine.backend == "vllm":
        from rlvr.engines.vllm_engine import VLLMEngine

        return VLLMEngine(
            served, engine, dtype=dtype, seed=seed, lora_rank=lora_rank, max_loras=max_loras, sleep_mode=sleep_mode
        )
    from rlvr.engines.hf_engine import HFEngine

    return HFEngine(served, engine, dtype=dtype, seed=seed)


def served_folder(folder: ModelFolder, native_nvfp4: bool = True) -> ModelFolder:
    """What the engine loads: `folder` itself, or the view of it written beside it (read into a
    record of its own). An NVFP4 checkpoint runs natively where vLLM has NVFP4 kernels (CUDA,
    `native_nvfp4`); elsewhere, and for NF4 always (vLLM 0.32 has no bitsandbytes method),
    the engine gets the dequantized values, written once beside it, which are exactly the numbers
    the trainer's packed layers compute with. transformers' generate (native_nvfp4 False) reads
    no compressed-tensors checkpoint without that package, so it gets the dequantized view too.
    A checkpoint in Mistral's layout keeps it for vLLM (native_nvfp4): vLLM serves that layout as
    MistralLarge3ForCausalLM, the math the trainer's `mistral4` runs, while an HF `mistral4`
    folder would reach vLLM's generic Transformers backend (it has no Mistral4ForCausalLM), whose
    CPU MoE op takes no float32; transformers' generate gets the HF layout."""
    import torch

    from rlvr.quant.checkpoint import dequantized_view
    from rlvr.quant.formats import is_quantized_checkpoint, quantized_format

    if not is_quantized_checkpoint(folder):
        return folder
    if native_nvfp4 and torch.cuda.is_available() and quantized_format(folder) == "nvfp4":
        return folder
    return read_model_folder(dequantized_view(folder, layout="mistral" if native_nvfp4 and folder.mistral else "hf"))


__all__ = ["Engine", "cpu_threads", "make_engine", "served_folder"]
