"""Quantized frozen bases: NVFP4 (compressed-tensors, MoE experts included) or NF4 (bitsandbytes), the packed Linears and experts, checkpoint I/O."""

from rlvr.quant.checkpoint import (
    dequantized_state_dict,
    dequantized_view,
    load_quantized_model,
    quantize_checkpoint,
    write_dequantized_checkpoint,
)
from rlvr.quant.formats import quantized_format
from rlvr.quant.linear import (
    NF4Linear,
    NVFP4Linear,
    QuantizedLinear,
    QuantizedLoraLinear,
    peft_targets_as_given,
    prepare_lora_config,
    quantized_linear_names,
)

__all__ = [
    "NF4Linear",
    "NVFP4Linear",
    "QuantizedLinear",
    "QuantizedLoraLinear",
    "dequantized_state_dict",
    "dequantized_view",
    "load_quantized_model",
    "peft_targets_as_given",
    "prepare_lora_config",
    "quantize_checkpoint",
    "quantized_format",
    "quantized_linear_names",
    "write_dequantized_checkpoint",
]
