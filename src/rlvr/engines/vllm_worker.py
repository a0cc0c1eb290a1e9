"""Code that runs inside vLLM's worker, next to the model: adapters and weights loaded from memory.

vLLM mixes this class into its worker (`worker_extension_cls`), so the engine reaches these
methods by name with `collective_rpc`; tensors travel as arguments: plain references
in-process; to a separate engine-core process (and on, pickled, to its worker processes) as a
`shared_file`: copied once into a file in /dev/shm that each worker maps copy-on-write, so the
bytes cross no pipe. (vLLM decodes the arguments of such calls without their types: a tensor
would arrive as a list that has lost its data buffer; `packed` bytes, where /dev/shm lacks the
room, are copied at every hop: into the message, out of it, into the pickle to the worker, out
of that.) No file outlives the call. Method names carry an `rlvr_` prefix because vLLM refuses
an extension whose attributes collide with the worker's.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from vllm.lora.lora_model import LoRAModel
from vllm.lora.peft_helper import PEFTHelper

from rlvr.records import LoraAdapter

SHARED_FOLDER = "/dev/shm"  # a tmpfs: the file's pages are memory, mapped by the workers
_ALIGNMENT = 64  # each tensor's offset in a shared file, in bytes


class WeightSyncExtension:
    """Worker-side adapter and weight loader; `self` is vLLM's worker."""

    if TYPE_CHECKING:  # what vLLM's worker, which this class is mixed into, brings
        model_runner: Any

        def reload_weights(self, weights_iterator: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def rlvr_reload_weights(self, weights) -> None:
        """The worker's own `reload_weights`, given named tensors (as `shipped` makes them).

        A merged adapter reloads only the modules it changes (rlvr.engines.lora_merge.merged_weights);
        vLLM then keeps every other layer as it is, warning once per layer and once more with the
        list of names that nothing was loaded for. That is the intent here, so those two loggers
        are held at errors for the call."""
        quiet = [
            logging.getLogger(f"vllm.model_executor.model_loader.reload.{name}") for name in ("layerwise", "inplace")
        ]
        levels = [logger.level for logger in quiet]
        for logger in quiet:
            logger.setLevel(logging.ERROR)
        try:
            self.reload_weights(weights_iterator=received(weights))
        finally:
            for logger, level in zip(quiet, levels):
                logger.setLevel(level)

    def rlvr_add_lora(self, lora_id: int, tensors, config: dict) -> None:
        """Register an adapter under `lora_id` built from PEFT-named tensors (as `shipped` makes
        them), as vLLM would from a folder.

        A request naming `lora_id` then finds it already loaded, so vLLM never looks at the
        request's (placeholder) path. vLLM keeps the tensors it is given, and on CPU scales each
        lora_B in place (`LoRALayerWeights.optimize`; on GPU it first copies them into pinned
        memory): these are the worker's own, a shared file's pages copied on that write.
        """
        tensors = dict(received(tensors))
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


def lora_payload(adapter: LoraAdapter, copy: bool) -> tuple[list[tuple[str, torch.Tensor]], dict]:
    """`adapter`'s tensors and config as `rlvr_add_lora` takes them (the tensors still to be `shipped`).

    vLLM keeps the tensors it is given and scales each lora_B in place (see rlvr_add_lora):
    in-process (`copy`) they must be copies, not the trainer's parameters (nor read-only views of
    Ray's object store); out of process the one copy is the shared file the worker maps."""
    named = [(name, t.detach().to("cpu", copy=copy).contiguous()) for name, t in adapter.tensors.items()]
    # JSON round trip: PEFT's dict holds sets and enums, which cannot cross to the worker.
    config = json.loads(json.dumps(adapter.config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))
    return named, config


@contextmanager
def shipped(named: list[tuple[str, torch.Tensor]], in_process: bool) -> Iterator[object]:
    """CPU `named` tensors as `collective_rpc` carries them to the worker: in-process the tensors
    themselves; else a `shared_file` for the call's duration (removed after it: the workers have
    mapped it by then), or, where /dev/shm lacks the room, `packed` ones."""
    if in_process:
        yield named
        return
    size = sum(_aligned(t.numel() * t.element_size()) for _, t in named)
    if not os.path.isdir(SHARED_FOLDER) or shutil.disk_usage(SHARED_FOLDER).free < size:
        yield [(name, packed(t)) for name, t in named]
        return
    handle, path = tempfile.mkstemp(prefix="rlvr-tensors-", dir=SHARED_FOLDER)
    os.close(handle)
    try:
        yield shared_file(named, path, size)
    finally:
        os.unlink(path)


def shared_file(named: list[tuple[str, torch.Tensor]], path: str, size: int) -> list:
    """The tensors copied into a new file of `size` bytes at `path` (each at an aligned offset),
    and what a worker needs to map them: [path, size, [[name, dtype, shape, offset], ...]]."""
    whole = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    entries, offset = [], 0
    for name, tensor in named:
        data = tensor.detach().reshape(-1).view(torch.uint8)
        whole[offset : offset + data.numel()].copy_(data)
        entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset])
        offset += _aligned(data.numel())
    return [path, size, entries]


def received(tensors) -> list[tuple[str, torch.Tensor]]:
    """Undo `shipped`: a shared file's tensors are views of one private (copy-on-write) mapping
    of it, so that vLLM writing to them changes neither the file nor another worker's view."""
    if not (len(tensors) == 3 and isinstance(tensors[0], str)):
        return [(name, as_tensor(t)) for name, t in tensors]
    path, size, entries = tensors
    whole = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    named = []
    for name, dtype, shape, offset in entries:
        dtype = getattr(torch, dtype)
        count = dtype.itemsize * math.prod(shape)
        named.append((name, whole[offset : offset + count].view(dtype).view(shape)))
    return named


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGNMENT) * _ALIGNMENT


def packed(tensor: torch.Tensor) -> tuple[str, list[int], bytes]:
    """A tensor as plain msgpack types, for a call into a separate engine-core process."""
    tensor = tensor.detach().to("cpu").contiguous()
    return str(tensor.dtype).removeprefix("torch."), list(tensor.shape), tensor.view(torch.uint8).numpy().tobytes()


def as_tensor(value) -> torch.Tensor:
    """Undo `packed`; a tensor passed in-process is returned as it is."""
    if isinstance(value, torch.Tensor):
        return value
    dtype, shape, data = value
    if not data:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=getattr(torch, dtype))
    return torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape)
