"""Code that runs inside vLLM's worker, next to the model: LoRA adapters loaded from memory.

vLLM mixes this class into its worker (`worker_extension_cls`), so the engine reaches these
methods by name with `collective_rpc`; tensors travel as arguments (in memory: zero-copy
msgpack buffers when the engine core is a separate process, plain references in-process).
No file is written. Method names carry an `rlvr_` prefix because vLLM refuses an extension
whose attributes collide with the worker's.
"""

from __future__ import annotations

import torch
from vllm.lora.lora_model import LoRAModel
from vllm.lora.peft_helper import PEFTHelper


class WeightSyncExtension:
    """Worker-side adapter loader; `self` is vLLM's worker.

    Full weights need no extension: the worker's own `reload_weights` takes tensors.
    """

    def rlvr_add_lora(self, lora_id: int, tensors: dict[str, torch.Tensor], config: dict) -> None:
        """Register an adapter under `lora_id` built from PEFT-named tensors, as vLLM would from a folder.

        A request naming `lora_id` then finds it already loaded, so vLLM never looks at the
        request's (placeholder) path.
        """
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
