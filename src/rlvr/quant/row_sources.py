"""Where a skeleton's packed tensors read their rows: each source reads rows `[start, stop)` of dim 0
(or the whole tensor) of a checkpoint's packed bytes, expert slices or expert scales. Float
tensors read through rlvr.models.checkpoint_files (rows_of, memory_source)."""

from __future__ import annotations

import torch

from rlvr.models.checkpoint_files import CheckpointFiles, Rows, Source
from rlvr.models.hub_layout import ExpertPiece
from rlvr.quant.experts import NVFP4Experts
from rlvr.quant.packed_bytes import STORAGE_DTYPE


def bytes_of(files: CheckpointFiles, key: str, columns: int) -> Source:
    """Rows of stored packed bytes (flat or `[rows, columns]`) in their parameter dtype."""
    stored_by_row = files.meta(key).shape[-1] == columns  # NVFP4 `[out, in/2]`; NF4 flat `[out * in/2, 1]`

    def read(rows: Rows) -> torch.Tensor:
        flat = rows if stored_by_row or rows is None else slice(rows.start * columns, rows.stop * columns)
        return files.read(key, flat).reshape(-1, columns).view(STORAGE_DTYPE)

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
