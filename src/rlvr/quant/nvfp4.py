"""NVFP4 weights in compressed-tensors' `nvfp4-pack-quantized` layout: pure tensor functions.

The format, for a Linear weight `W` of shape `[out, in]` (`in` a multiple of 16):

- `weight_packed`  uint8 `[out, in // 2]`: E2M1 codes, two per byte; the element at even
  column `2j` sits in the low nibble, the one at `2j + 1` in the high nibble. A code is
  `sign << 3 | magnitude`, magnitude an index into `E2M1_MAGNITUDES` (0, 0.5, 1, 1.5, 2, 3, 4, 6).
- `weight_scale`   float8_e4m3fn `[out, in // 16]`: one scale per group of 16 consecutive
  columns of a row.
- `weight_global_scale` float32 `[1]`: stored as a *divisor*, `448 * 6 / amax(W)`, so that the
  largest group scale uses the whole FP8 range. vLLM's loader says the same ("CT stores as
  divisors, i.e. 1/scale").

Dequantization is `W[r, c] = e2m1(code[r, c]) * (float(weight_scale[r, c // 16]) / weight_global_scale)`,
computed in float32 in exactly that order, which is what compressed-tensors 0.17 does, so the
values are bit-identical to its decompressor's (that one then rounds to bfloat16).

Quantization follows compressed-tensors' observers and rounding: group scales
`fp8(global * amax(group) / 6)` (a group scale that rounds to 0 becomes 0.125), values
`W / (scale / global)` clamped to [-6, 6] and rounded to the nearest E2M1 value with ties to
the even mantissa (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); the
sign bit is the sign bit of W, so a small negative weight packs as negative zero (code 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.quant.packed_bytes import as_bytes

GROUP_SIZE = 16
FP4_MAX = 6.0
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
# compressed-tensors replaces a group scale that is zero in FP8 by this value (its FP8 "eps")
ZERO_SCALE_REPLACEMENT = 0.125

E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# Midpoints between neighbouring magnitudes, and whether a value exactly on one rounds up:
# ties go to the magnitude with an even mantissa bit (0, 1, 2, 4, i.e. even indices).
_ROUNDING_THRESHOLDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_TIE_ROUNDS_UP = torch.tensor([False, True, False, True, False, True, False])


def _byte_to_pair_table() -> torch.Tensor:
    """[256, 2] float32: the two E2M1 values (low nibble first) that each byte encodes."""
    codes = torch.arange(16)
    signed = torch.where(codes >= 8, -1.0, 1.0) * E2M1_MAGNITUDES[codes % 8]
    byte = torch.arange(256)
    return torch.stack([signed[byte & 0x0F], signed[byte >> 4]], dim=-1)


# One gather per byte decodes both nibbles: no bit twiddling in the per-forward path.
BYTE_TO_E2M1_PAIR = _byte_to_pair_table()


@dataclass(frozen=True)
class NVFP4Weight:
    """The three tensors that store one quantized weight (names as in the checkpoint)."""

    weight_packed: torch.Tensor  # uint8 [out, in // 2]
    weight_scale: torch.Tensor  # float8_e4m3fn [out, in // 16]
    weight_global_scale: torch.Tensor  # float32 [1]


def global_scale_for(amax: torch.Tensor) -> torch.Tensor:
    """float32 [1] divisor `448 * 6 / amax` (1.0 where amax is 0 or not finite), as compressed-tensors."""
    amax = torch.clamp(amax.float(), min=torch.finfo(torch.float32).tiny)
    scale = FP8_MAX * FP4_MAX / amax
    return torch.nan_to_num(scale, nan=1.0, posinf=1.0, neginf=1.0).reshape(1)


def _check_weight(weight: torch.Tensor) -> None:
    if weight.ndim != 2 or weight.shape[1] % GROUP_SIZE != 0:
        raise ValueError(
            f"NVFP4 needs a 2-D weight whose columns are a multiple of {GROUP_SIZE}, got shape {tuple(weight.shape)}"
        )
    if not torch.isfinite(weight).all():
        raise ValueError("NVFP4 cannot quantize a weight with NaN or infinite values")


def group_scales(weight: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn [out, in // 16]: `global * amax(group) / 6` rounded to FP8, zeros replaced."""
    groups = weight.float().unflatten(-1, (-1, GROUP_SIZE))
    scales = global_scale * (groups.abs().amax(dim=-1) / FP4_MAX)
    scales = torch.clamp(scales, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    scales = torch.where(scales == 0, torch.tensor(ZERO_SCALE_REPLACEMENT), scales)
    return scales.to(torch.float8_e4m3fn)


def quantize(weight: torch.Tensor, global_scale: torch.Tensor | None = None) -> NVFP4Weight:
    """Quantize a float weight `[out, in]` to NVFP4.

    `global_scale` defaults to the weight's own (`global_scale_for(amax)`); pass a shared one
    for layers that vLLM fuses into one GEMM (q/k/v, gate/up), which must agree on it.
    """
    _check_weight(weight)
    weight = weight.float()
    if global_scale is None:
        global_scale = global_scale_for(weight.abs().max())
    global_scale = global_scale.float().reshape(1)
    scale = group_scales(weight, global_scale)
    step = (scale.float() / global_scale).repeat_interleave(GROUP_SIZE, dim=-1)
    scaled = weight / step
    magnitude = torch.clamp(scaled.abs(), max=FP4_MAX).unsqueeze(-1)
    passed = (magnitude > _ROUNDING_THRESHOLDS) | ((magnitude == _ROUNDING_THRESHOLDS) & _TIE_ROUNDS_UP)
    codes = passed.sum(dim=-1, dtype=torch.uint8) | (torch.signbit(scaled).to(torch.uint8) << 3)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return NVFP4Weight(packed.contiguous(), scale, global_scale)


def dequantize(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_global_scale: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Float weight `[out, in]` from the packed tensors, computed in float32, returned in `dtype`."""
    weight_packed = as_bytes(weight_packed)
    rows, packed_columns = weight_packed.shape
    # an embedding lookup of the byte table: the same gather as table[codes], ~3.5x faster on
    # CPU than advanced indexing, and this runs for every layer in every forward and backward
    values = F.embedding(weight_packed.int(), BYTE_TO_E2M1_PAIR.to(weight_packed.device)).reshape(rows, -1, GROUP_SIZE)
    step = weight_scale.float() / weight_global_scale.float()
    # in place: this runs for every layer in every forward and backward, so one float32
    # temporary fewer is a third less transient memory
    return values.mul_(step.unsqueeze(-1)).reshape(rows, 2 * packed_columns).to(dtype)


def check_shapes(weight: NVFP4Weight, where: str) -> None:
    """Raise a one-line error naming `where` if the tensors do not form one NVFP4 weight."""
    packed, scale, global_scale = weight.weight_packed, weight.weight_scale, weight.weight_global_scale
    problems = []
    if packed.dtype != torch.uint8 or packed.ndim != 2:
        problems.append(f"weight_packed must be 2-D uint8, is {packed.dtype} {tuple(packed.shape)}")
    elif packed.shape[1] * 2 % GROUP_SIZE != 0:
        problems.append(f"weight_packed has {packed.shape[1] * 2} columns, not a multiple of {GROUP_SIZE}")
    elif tuple(scale.shape) != (packed.shape[0], packed.shape[1] * 2 // GROUP_SIZE):
        problems.append(f"weight_scale shape {tuple(scale.shape)} does not match weight_packed {tuple(packed.shape)}")
    if scale.dtype != torch.float8_e4m3fn:
        problems.append(f"weight_scale must be float8_e4m3fn, is {scale.dtype}")
    if global_scale.numel() != 1 or not global_scale.dtype.is_floating_point:
        problems.append(f"weight_global_scale must be one float, is {global_scale.dtype} {tuple(global_scale.shape)}")
    if problems:
        raise ValueError(f"{where}: {'; '.join(problems)}")
