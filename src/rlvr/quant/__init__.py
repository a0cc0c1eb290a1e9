"""Quantized frozen bases: NVFP4 in compressed-tensors' format, the packed Linear, checkpoint I/O."""

from rlvr.quant.checkpoint import (
    dequantized_state_dict,
    load_quantized_model,
    quantize_checkpoint,
    write_dequantized_checkpoint,
)
from rlvr.quant.linear import NVFP4Linear, NVFP4LoraLinear, prepare_lora_config, quantized_linear_names

__all__ = [
    "NVFP4Linear",
    "NVFP4LoraLinear",
    "dequantized_state_dict",
    "load_quantized_model",
    "prepare_lora_config",
    "quantize_checkpoint",
    "quantized_linear_names",
    "write_dequantized_checkpoint",
]
