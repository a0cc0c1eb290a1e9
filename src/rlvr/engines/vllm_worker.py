"""Code that runs inside vLLM's worker, next to the model: adapters and weights loaded from memory.

vLLM mixes this class into its worker (`worker_extension_cls`), so the engine reaches these
methods by name with `collective_rpc`; tensors travel as arguments: plain references
in-process; to a separate engine-core process as `packed` (dtype, shape, bytes) triples, since
vLLM decodes the arguments of such calls without their types and a tensor would arrive as a
list that has lost its data buffer.
No file is written. Method names carry an `rlvr_` prefix because vLLM refuses an extension
whose attributes collide with the worker's.
"""

from __future__ import annotations

import logging

import torch
from vllm.lora.lora_model import LoRAModel
from vllm.lora.peft_helper import PEFTHelper


class WeightSyncExtension:
    """Worker-side adapter and weight loader; `self` is vLLM's worker."""

    def rlvr_reload_weights(self, weights: list[tuple[str, tuple]]) -> None:
        """The worker's own `reload_weights`, given tensors (`packed` from another process).

        A merged adapter reloads only the modules it changes (rlvr.engines.vllm_engine.merged_weights);
        vLLM then keeps every other layer as it is, warning once per layer and once more with the
        list of names that nothing was loaded for. That is the intent here, so those two loggers
        are held at errors for the call."""
        quiet = [logging.getLogger(f"vllm.model_executor.model_loader.reload.{name}") for name in ("layerwise", "inplace")]
        levels = [logger.level for logger in quiet]
        for logger in quiet:
            logger.setLevel(logging.ERROR)
        try:
            self.reload_weights(weights_iterator=[(name, as_tensor(t)) for name, t in weights])
        finally:
            for logger, level in zip(quiet, levels):
                logger.setLevel(level)

    def rlvr_add_lora(self, lora_id: int, tensors: dict[str, torch.Tensor], config: dict) -> None:
        """Register an adapter under `lora_id` built from PEFT-named tensors, as vLLM would from a folder.

        A request naming `lora_id` then finds it already loaded, so vLLM never looks at the
        request's (placeholder) path.
        """
        tensors = {name: as_tensor(t) for name, t in tensors.items()}
        manager = self.model_runner.lora_manager
        helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
        helper.validate_legal(manager.lora_config)
        model = manager._adapter_manager.model
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        adapter = LoRAModel.from_lora_tensors(
            lora_id,
            tensors,
            helper,
            device="cpu",  # vLLM stages adapters on the host and copies them into its slots
            dtype=manager.lora_config.lora_dtype,
            model_vocab_size=manager.vocab_size,
            weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
            skip_prefixes=getattr(model, "lora_skip_prefixes", None),
        )
        manager._adapter_manager.add_adapter(adapter)


def packed(tensor: torch.Tensor) -> tuple[str, list[int], bytes]:
    """A tensor as plain msgpack types, for a call into a separate engine-core process."""
    tensor = tensor.detach().to("cpu").contiguous()
    return str(tensor.dtype).removeprefix("torch."), list(tensor.shape), tensor.view(torch.uint8).numpy().tobytes()


def as_tensor(value) -> torch.Tensor:
    """Undo `packed`; a tensor passed in-process is returned as it is."""
    if isinstance(value, torch.Tensor):
        return value
    dtype, shape, data = value
    return torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape)
