"""Which 4-bit format a checkpoint folder declares: compressed-tensors' NVFP4 or bitsandbytes' NF4,
read from its config (config.json, or params.json's `quantization`) and checked to be the one
rlvr.quant.checkpoint writes and reads; and the NVFP4 `quantization_config` it writes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlvr.models.folder import ModelFolder, as_model_folder, config_file
from rlvr.quant import nf4, nvfp4

FORMAT_NAME = "nvfp4-pack-quantized"
QUANT_METHOD = "compressed-tensors"
BITSANDBYTES_METHOD = "bitsandbytes"
# The compressed-tensors release whose on-disk format and config rlvr.quant.checkpoint writes.
COMPRESSED_TENSORS_VERSION = "0.17.0"


def is_quantized_checkpoint(model: ModelFolder | str | Path) -> bool:
    """Whether the config (config.json, or params.json's `quantization`) declares a
    quantization_config (then read_quantization_config checks it); False for a path with no config."""
    if not isinstance(model, ModelFolder) and not config_file(model).is_file():
        return False
    return bool(as_model_folder(model).quantization_config)


def read_quantization_config(model: ModelFolder | str | Path) -> dict:
    """The checkpoint's `quantization_config`, checked to be NVFP4 or NF4 as this module reads them."""
    model = as_model_folder(model)
    config_path, quantization_config = model.config_file, model.quantization_config
    if not quantization_config:
        raise ValueError(f"{config_path}: no quantization_config (not a quantized checkpoint)")
    if quantization_config.get("quant_method") == BITSANDBYTES_METHOD:
        nf4.check_quantization_config(quantization_config, str(config_path))
        return quantization_config
    if quantization_config.get("quant_method") != QUANT_METHOD:
        raise ValueError(
            f"{config_path}: quant_method is {quantization_config.get('quant_method')!r}, "
            f"not {QUANT_METHOD!r} or {BITSANDBYTES_METHOD!r}"
        )
    for group_name, group in quantization_config.get("config_groups", {}).items():
        group_format = group.get("format") or quantization_config.get("format")
        weights = group.get("weights") or {}
        expected = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": nvfp4.GROUP_SIZE}
        wrong = {key: weights.get(key) for key, value in expected.items() if weights.get(key) != value}
        if group_format != FORMAT_NAME or wrong or weights.get("symmetric") is False:
            raise ValueError(
                f"{config_path}: config group {group_name!r} is not NVFP4 "
                f"(format {group_format!r}, weights {wrong or 'asymmetric'}); only {FORMAT_NAME} is supported"
            )
    return quantization_config


def quantized_format(model: ModelFolder | str | Path) -> str:
    """The format of a quantized checkpoint, "nvfp4" or "nf4" (its config checked)."""
    method = read_quantization_config(model)["quant_method"]
    return "nf4" if method == BITSANDBYTES_METHOD else "nvfp4"


def _fp4_args(dynamic: bool | str, observer: str) -> dict:
    """One QuantizationArgs as compressed-tensors 0.17 serializes it for NVFP4."""
    return {
        "actorder": None,
        "block_structure": None,
        "dynamic": dynamic,
        "group_size": nvfp4.GROUP_SIZE,
        "num_bits": 4,
        "observer": observer,
        "observer_kwargs": {},
        "scale_dtype": "torch.float8_e4m3fn",
        "strategy": "tensor_group",
        "symmetric": True,
        "type": "float",
        "zp_dtype": None,
    }


def nvfp4_quantization_config(ignore: Sequence[str]) -> dict:
    """The `quantization_config` llm-compressor writes for scheme "NVFP4" targeting Linear."""
    return {
        "config_groups": {
            "group_0": {
                "format": FORMAT_NAME,
                "input_activations": _fp4_args("local", "static_minmax"),
                "output_activations": None,
                "targets": ["Linear"],
                "weights": _fp4_args(False, "memoryless_minmax"),
            }
        },
        "format": FORMAT_NAME,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": COMPRESSED_TENSORS_VERSION,
    }
