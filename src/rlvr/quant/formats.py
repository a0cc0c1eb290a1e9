"""Which 4-bit format a checkpoint folder declares: compressed-tensors' NVFP4 or bitsandbytes' NF4,
read from its config (config.json, or params.json's `quantization`) and checked to be the one
rlvr.quant.checkpoint writes and reads."""

from __future__ import annotations

from pathlib import Path

from rlvr.models.folder import config_file, model_config_dict
from rlvr.quant import nf4, nvfp4

FORMAT_NAME = "nvfp4-pack-quantized"
QUANT_METHOD = "compressed-tensors"
BITSANDBYTES_METHOD = "bitsandbytes"


def is_quantized_checkpoint(model_dir: str | Path) -> bool:
    """Whether the config (config.json, or params.json's `quantization`) declares a
    quantization_config (then read_quantization_config checks it)."""
    return config_file(model_dir).is_file() and bool(model_config_dict(model_dir).get("quantization_config"))


def read_quantization_config(model_dir: str | Path) -> dict:
    """The checkpoint's `quantization_config`, checked to be NVFP4 or NF4 as this module reads them."""
    config_path = config_file(model_dir)
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: no {config_path.name}")
    quantization_config = model_config_dict(model_dir).get("quantization_config")
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


def quantized_format(model_dir: str | Path) -> str:
    """The format of a quantized checkpoint, "nvfp4" or "nf4" (its config checked)."""
    method = read_quantization_config(model_dir)["quant_method"]
    return "nf4" if method == BITSANDBYTES_METHOD else "nvfp4"
