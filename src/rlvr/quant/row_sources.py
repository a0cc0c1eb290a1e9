"""Where a skeleton's tensors read their rows: each source reads rows `[start, stop)` of dim 0 (or
the whole tensor) from a checkpoint's files, cast to the dtype of the tensor it fills, and each
stored header is checked against the shape the model needs before anything is read."""

from __future__ import annotations

import torch
from torch import nn

from rlvr.models.checkpoint_files import CheckpointFiles, Rows, Source
from rlvr.models.hub_layout import ExpertPiece, disk_tensors, expert_pieces
from rlvr.quant.experts import NVFP4Experts
from rlvr.quant.packed_bytes import STORAGE_DTYPE


def rows_of(files: CheckpointFiles, key: str, dtype: torch.dtype | None = None) -> Source:
    """Rows of one stored tensor, cast to `dtype` (None: as stored)."""

    def read(rows: Rows) -> torch.Tensor:
        tensor = files.read(key, rows)
        return tensor if dtype is None else tensor.to(dtype)

    return read


def bytes_of(files: CheckpointFiles, key: str, columns: int) -> Source:
    """Rows of stored packed bytes (flat or `[rows, columns]`) in their parameter dtype."""
    stored_by_row = files.meta(key).shape[-1] == columns  # NVFP4 `[out, in/2]`; NF4 flat `[out * in/2, 1]`

    def read(rows: Rows) -> torch.Tensor:
        flat = rows if stored_by_row or rows is None else slice(rows.start * columns, rows.stop * columns)
        return files.read(key, flat).reshape(-1, columns).view(STORAGE_DTYPE)

    return read


def float_source(
    model: nn.Module, files: CheckpointFiles, key: str, shape: torch.Size, dtype: torch.dtype
) -> Source | None:
    """The on-disk tensor(s) of the in-memory tensor `key`: one stored whole, or a fused experts
    parameter from its per-expert pieces; None where the files have none."""
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

    def read(rows: Rows) -> torch.Tensor:
        rows = rows or slice(0, shape[0])
        fused = torch.empty(rows.stop - rows.start, *shape[1:], dtype=dtype)
        for p in pieces:
            if rows.start <= p.expert < rows.stop:
                fused[p.expert - rows.start, p.start : p.stop] = files.read(f"{p.prefix}.weight")
        return fused

    return read


def expert_rows(files: CheckpointFiles, pieces: list[ExpertPiece], like: NVFP4Experts, suffix: str) -> Source:
    """Experts [start, stop) of a packed projection's `weight_packed` or `weight_scale`."""
    shape = getattr(like, suffix).shape

    def read(rows: Rows) -> torch.Tensor:
        rows = rows or slice(0, shape[0])
        dtype = torch.uint8 if suffix == "weight_packed" else torch.float8_e4m3fn
        out = torch.empty(rows.stop - rows.start, *shape[1:], dtype=dtype)
        for p in pieces:
            if rows.start <= p.expert < rows.stop:
                out[p.expert - rows.start, p.start : p.stop] = files.read(f"{p.prefix}.{suffix}")
        return out.view(STORAGE_DTYPE) if suffix == "weight_packed" else out

    return read


def expert_scales(files: CheckpointFiles, pieces: list[ExpertPiece], like: NVFP4Experts, suffix: str) -> Source:
    """A packed projection's `[E, parts]` global scales (1 where the files have no input scale)."""

    def read(rows: Rows) -> torch.Tensor:
        scales = torch.ones(like.weight_global_scale.shape)
        for p in pieces:
            if f"{p.prefix}.{suffix}" in files:
                scales[p.expert, p.part] = files.read(f"{p.prefix}.{suffix}").reshape(())
        return scales if rows is None else scales[rows]

    return read


def check_shape(where: str, stored: torch.Tensor, wanted: tuple[int, ...]) -> None:
    if tuple(stored.shape) != tuple(wanted):
        raise ValueError(f"{where} has shape {tuple(stored.shape)}, the model needs {tuple(wanted)}")
