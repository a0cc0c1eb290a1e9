"""NF4 weights as bitsandbytes stores them (QLoRA's 4-bit NormalFloat): pure tensor functions.

NF4 (Dettmers et al. 2023) is a 16-entry codebook, the quantiles of N(0, 1) normalised to
[-1, 1] with an exact zero (`NF4_CODE`, the values bitsandbytes hard-codes). A weight is cut
into blocks of 64 consecutive elements (row-major); each block stores its absmax in float32
and each element the index of the nearest codebook value to `element / absmax`.

In memory (`NF4Weight`) a Linear weight `[out, in]` (`in` a multiple of 64, so that blocks
never span rows and the tensors can be split by rows) is:

- `weight_packed` uint8 `[out, in // 2]`: two indices per byte, the element at even column
  `2j` in the **high** nibble, `2j + 1` in the low one (bitsandbytes' order; NVFP4's is the
  reverse);
- `weight_absmax` float32 `[out, in // 64]`.

On disk (bitsandbytes 0.50 `Linear4bit` state dict, as transformers saves it) the same bytes are
flat: `P.weight` uint8 `[out * in // 2, 1]`, `P.weight.absmax` float32 `[out * in // 64]`,
`P.weight.quant_map` float32 `[16]` (the codebook), and `P.weight.quant_state.bitsandbytes__nf4`,
the JSON `{"quant_type": "nf4", "blocksize": 64, "dtype": ..., "shape": [out, in]}` as uint8
bytes. No double quantization: absmax stays float32 (`bnb_4bit_use_double_quant: false`).

Dequantization is `W = NF4_CODE[index] * absmax` in float32 (one multiply, as bitsandbytes).
Quantization follows bitsandbytes' torch kernel (its CPU path): `element * (1 / absmax)` clamped
to [-1, 1], then the index of the codebook interval it falls in, bounded by the float32
midpoints of neighbouring values; a value exactly on a midpoint takes the lower index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.quant.packed_bytes import as_bytes

BLOCK_SIZE = 64
QUANT_TYPE = "nf4"
QUANT_STATE_KEY = f"quant_state.bitsandbytes__{QUANT_TYPE}"
# one layer's tensors after `P.` (bitsandbytes' Linear4bit state dict, no double quantization)
CHECKPOINT_SUFFIXES = ("weight", "weight.absmax", "weight.quant_map", f"weight.{QUANT_STATE_KEY}")
NF4_CODE = torch.tensor(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ]
)
_MIDPOINTS = (NF4_CODE[:-1] + NF4_CODE[1:]) / 2
# bitsandbytes replaces an all-zero block's absmax by this before dividing (it stores the 0)
_TINY_ABSMAX = 1e-38

# One gather per byte decodes both nibbles (high nibble first), as in rlvr.quant.nvfp4.
BYTE_TO_NF4_PAIR = torch.stack([NF4_CODE[torch.arange(256) >> 4], NF4_CODE[torch.arange(256) & 0x0F]], dim=-1)


@dataclass(frozen=True)
class NF4Weight:
    """The two tensors that store one quantized weight, in rlvr's row layout."""

    weight_packed: torch.Tensor  # uint8 [out, in // 2]
    weight_absmax: torch.Tensor  # float32 [out, in // 64]


def quantize(weight: torch.Tensor) -> NF4Weight:
    """Quantize a float weight `[out, in]` (`in` a multiple of 64) to NF4, as bitsandbytes does."""
    if weight.ndim != 2 or weight.shape[1] % BLOCK_SIZE != 0:
        raise ValueError(
            f"NF4 needs a 2-D weight whose columns are a multiple of {BLOCK_SIZE}, got shape {tuple(weight.shape)}"
        )
    if not torch.isfinite(weight).all():
        raise ValueError("NF4 cannot quantize a weight with NaN or infinite values")
    blocks = weight.float().unflatten(-1, (-1, BLOCK_SIZE))  # [out, in // 64, 64]
    absmax = blocks.abs().amax(dim=-1)
    scaled = torch.clamp(blocks * (1.0 / absmax.clamp(min=_TINY_ABSMAX)).unsqueeze(-1), -1, 1)
    codes = torch.bucketize(scaled, _MIDPOINTS).to(torch.uint8).flatten(-2)  # [out, in]
    return NF4Weight((codes[:, 0::2] << 4 | codes[:, 1::2]).contiguous(), absmax)


def dequantize(
    weight_packed: torch.Tensor, weight_absmax: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Float weight `[out, in]` from the packed tensors, computed in float32, returned in `dtype`."""
    weight_packed = as_bytes(weight_packed)
    rows, packed_columns = weight_packed.shape
    # an embedding lookup of the byte table: the gather table[codes], faster on CPU (see nvfp4)
    values = F.embedding(weight_packed.int(), BYTE_TO_NF4_PAIR.to(weight_packed.device)).reshape(rows, -1, BLOCK_SIZE)
    # in place, as nvfp4.dequantize: one float32 temporary fewer per layer per pass
    return values.mul_(weight_absmax.float().unsqueeze(-1)).reshape(rows, 2 * packed_columns).to(dtype)


# --------------------------------------------------------------------------- bitsandbytes' layout


def quant_state_tensor(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """The uint8 JSON bitsandbytes keeps the non-tensor quant state in (its key order and spacing)."""
    state = {
        "quant_type": QUANT_TYPE,
        "blocksize": BLOCK_SIZE,
        "dtype": str(dtype).removeprefix("torch."),
        "shape": list(shape),
    }
    return torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)


def to_checkpoint(weight: NF4Weight, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of one layer's `P.weight…` keys (suffixes after `P.`); `dtype` is the source weight's."""
    rows, packed_columns = weight.weight_packed.shape
    return {
        "weight": weight.weight_packed.reshape(-1, 1),
        "weight.absmax": weight.weight_absmax.reshape(-1),
        "weight.quant_map": NF4_CODE.clone(),
        f"weight.{QUANT_STATE_KEY}": quant_state_tensor((rows, 2 * packed_columns), dtype),
    }


def from_checkpoint(stored: dict[str, torch.Tensor], where: str) -> NF4Weight:
    """The `NF4Weight` of one layer's stored tensors (keys as in `to_checkpoint`), checked.

    Raises a one-line error naming `where` for a missing tensor, another codebook or block size,
    double quantization, or a shape rlvr's row layout cannot hold.
    """
    missing = [suffix for suffix in CHECKPOINT_SUFFIXES if suffix not in stored]
    if missing:
        raise ValueError(f"{where}: has weight.{QUANT_STATE_KEY} but no {' or '.join(missing)}")
    extra = sorted(set(stored) - set(CHECKPOINT_SUFFIXES))
    if extra:
        raise ValueError(f"{where}: has {extra[0]}: double-quantized NF4 (nested absmax) is not supported")
    try:
        state = json.loads(bytes(stored[f"weight.{QUANT_STATE_KEY}"].tolist()).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where}: weight.{QUANT_STATE_KEY} is not JSON ({err})") from None
    shape = state.get("shape") or []
    problems = []
    if state.get("quant_type") != QUANT_TYPE or state.get("blocksize") != BLOCK_SIZE:
        problems.append(
            f"quant_type {state.get('quant_type')!r} blocksize {state.get('blocksize')!r}, not nf4 / {BLOCK_SIZE}"
        )
    elif len(shape) != 2 or shape[1] % BLOCK_SIZE:
        problems.append(f"shape {shape} is not [out, in] with in a multiple of {BLOCK_SIZE}")
    elif stored["weight"].dtype != torch.uint8 or stored["weight"].numel() * 2 != shape[0] * shape[1]:
        problems.append(
            f"weight is {stored['weight'].dtype} with {stored['weight'].numel()} bytes, not uint8 for {shape}"
        )
    elif stored["weight.absmax"].numel() * BLOCK_SIZE != shape[0] * shape[1]:
        problems.append(
            f"weight.absmax has {stored['weight.absmax'].numel()} values, not one per {BLOCK_SIZE} of {shape}"
        )
    elif not torch.equal(stored["weight.quant_map"].float(), NF4_CODE):
        problems.append("weight.quant_map is not the NF4 codebook")
    if problems:
        raise ValueError(f"{where}: {'; '.join(problems)}")
    rows, columns = shape
    return NF4Weight(
        stored["weight"].reshape(rows, columns // 2),
        stored["weight.absmax"].float().reshape(rows, columns // BLOCK_SIZE),
    )


def quantization_config(ignore: list[str], compute_dtype: torch.dtype) -> dict:
    """The `quantization_config` transformers 5 writes for `BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", llm_int8_skip_modules=ignore)`."""
    return {
        "_load_in_4bit": True,
        "_load_in_8bit": False,
        "bnb_4bit_compute_dtype": str(compute_dtype).removeprefix("torch."),
        "bnb_4bit_quant_storage": "uint8",
        "bnb_4bit_quant_type": QUANT_TYPE,
        "bnb_4bit_use_double_quant": False,
        "llm_int8_enable_fp32_cpu_offload": False,
        "llm_int8_has_fp16_weight": False,
        "llm_int8_skip_modules": list(ignore),
        "llm_int8_threshold": 6.0,
        "load_in_4bit": True,
        "load_in_8bit": False,
        "quant_method": "bitsandbytes",
    }


def check_quantization_config(config: dict, where: str) -> None:
    """Raise a one-line error naming `where` unless `config` declares single-quantized NF4."""
    expected = {"load_in_4bit": True, "bnb_4bit_quant_type": QUANT_TYPE}
    wrong = {key: config.get(key) for key, value in expected.items() if config.get(key) != value}
    if config.get("bnb_4bit_use_double_quant"):
        wrong["bnb_4bit_use_double_quant"] = True
    if wrong:
        raise ValueError(
            f"{where}: bitsandbytes quantization_config {wrong} is not supported; rlvr reads NF4 4-bit without double quantization"
        )
