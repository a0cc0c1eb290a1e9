"""A checkpoint folder's tensors by transformers' on-disk names, headers read at once and rows read
as asked: the one reader under the trainer's sharded load, the quantizer and the Mistral import,
and where each in-memory tensor of a model comes from in it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from rlvr.models.folder import ModelFolder, as_model_folder
from rlvr.models.hub_layout import disk_tensors, expert_pieces
from rlvr.models.mistral_layout import TensorNames
from rlvr.models.multimodal import text_model_names

# safetensors' dtype names (the header's), for checking a header without reading the tensor
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

Rows = slice | None  # rows [start, stop) of dim 0; None: the whole tensor (and 0-d tensors)
Source = Callable[[Rows], torch.Tensor]  # the rows, in the dtype of the tensor they fill


class CheckpointFiles:
    """The tensors of a folder's safetensors files by their transformers on-disk names: headers
    read at once, data only as asked. A folder in Mistral's layout is read under the names vLLM
    maps it to (rlvr.models.mistral_layout), its image encoder left out."""

    def __init__(self, model: ModelFolder | str | Path):
        model = as_model_folder(model)
        if not model.weight_files:
            raise FileNotFoundError(f"{model.path}: no *.safetensors files")
        self._handles = {path: safe_open(path, framework="pt") for path in model.weight_files}
        self._names = TensorNames(model.transformers_config()) if model.mistral else None
        self._stored: dict[str, str] = {}  # name -> the name in the file, where they differ
        self._path = {}
        # a multimodal checkpoint's language model, without its encoders
        own_name = text_model_names(model.stored_config)
        for path, handle in self._handles.items():
            for key in handle.keys():
                name = own_name(key) if self._names is None else self._hf_name(handle, key)
                if name is not None:
                    self._path[name] = path
                    self._stored[name] = key
        self.unclaimed = set(self._path)  # tensors no module has taken yet

    def _hf_name(self, handle, key: str) -> str | None:
        stored = handle.get_slice(key)
        mapped = self._names.to_hf(
            key, torch.empty(stored.get_shape(), dtype=_DTYPES[stored.get_dtype()], device="meta")
        )
        return None if mapped is None else mapped[0]

    def __contains__(self, key: str) -> bool:
        return key in self._path

    def keys(self) -> list[str]:
        return list(self._path)

    def where(self, key: str, name: str | None = None) -> str:
        """`file: name` for messages: the file holding `key`, then `name` (default: the key)."""
        stored = self._stored[key]
        return f"{self._path[key]}: {name or key}" + (f" ({stored})" if stored != key and name is None else "")

    def meta(self, key: str) -> torch.Tensor:
        """A meta tensor of the stored tensor's shape and dtype; claims it."""
        self.unclaimed.discard(key)
        stored = self._handles[self._path[key]].get_slice(self._stored[key])
        return torch.empty(stored.get_shape(), dtype=_DTYPES[stored.get_dtype()], device="meta")

    def read(self, key: str, rows: Rows = None) -> torch.Tensor:
        self.unclaimed.discard(key)
        handle, stored = self._handles[self._path[key]], self._stored[key]
        if self._names is not None and self._names.needs_whole_tensor(stored):
            tensor = self._names.to_hf(stored, handle.get_tensor(stored))[1]
            return tensor if rows is None else tensor[rows]
        return handle.get_tensor(stored) if rows is None else handle.get_slice(stored)[rows]


def rows_of(files: CheckpointFiles, key: str, dtype: torch.dtype | None = None) -> Source:
    """Rows of one stored tensor, cast to `dtype` (None: as stored)."""

    def read(rows: Rows) -> torch.Tensor:
        tensor = files.read(key, rows)
        return tensor if dtype is None else tensor.to(dtype)

    return read


def check_shape(where: str, stored: torch.Tensor, wanted: tuple[int, ...]) -> None:
    if tuple(stored.shape) != tuple(wanted):
        raise ValueError(f"{where} has shape {tuple(stored.shape)}, the model needs {tuple(wanted)}")


def memory_source(
    model: nn.Module, files: CheckpointFiles, key: str, shape: torch.Size, dtype: torch.dtype | None = None
) -> Source | None:
    """The on-disk tensor(s) of `model`'s in-memory tensor `key`, through its conversion mapping:
    one stored whole, or a fused experts parameter from its per-expert pieces; None where the
    files have none. `dtype` None: as stored."""
    stored = disk_tensors(model, key, torch.empty(shape, device="meta"))
    if len(stored) == 1 and next(iter(stored.values())).shape == shape:
        name = next(iter(stored))
        if name not in files:
            return None
        check_shape(files.where(name), files.meta(name), tuple(shape))
        return rows_of(files, name, dtype)
    pieces = expert_pieces(model, key, shape)
    if not all(f"{p.prefix}.weight" in files for p in pieces):
        if key in files:  # stored fused, as save_pretrained writes it where transformers has no conversion
            check_shape(files.where(key), files.meta(key), tuple(shape))
            return rows_of(files, key, dtype)
        return None
    for p in pieces:
        check_shape(files.where(f"{p.prefix}.weight"), files.meta(f"{p.prefix}.weight"), (p.stop - p.start, shape[2]))
    fused_dtype = dtype or files.meta(f"{pieces[0].prefix}.weight").dtype

    def read(rows: Rows) -> torch.Tensor:
        rows = rows or slice(0, shape[0])
        fused = torch.empty(rows.stop - rows.start, *shape[1:], dtype=fused_dtype)
        for p in pieces:
            if rows.start <= p.expert < rows.stop:
                fused[p.expert - rows.start, p.start : p.stop] = files.read(f"{p.prefix}.weight")
        return fused

    return read
