"""A frozen Linear whose weight stays NVFP4-packed, and the peft LoRA layer that wraps it.

`NVFP4Linear` keeps `weight_packed` (uint8), `weight_scale` (FP8) and `bias` as frozen
parameters, which FSDP2 shards across the trainer ranks (it shards parameters, never buffers),
and the one-float `weight_global_scale` and `input_global_scale` (the latter kept only so a
re-saved checkpoint stays complete) as buffers. All are named as in the checkpoint, so
`state_dict()` is the compressed-tensors layout; the trainer's checkpoints, which skip frozen
parameters, skip the packed base. The float weight exists only while one layer computes: the
autograd function below dequantizes in forward and again in backward instead of saving it, so
training memory holds the packed bytes (~0.56 byte per weight), not a float copy per layer.

LoRA: `NVFP4LoraLinear` is a peft `lora.Linear` whose base layer is an `NVFP4Linear`; peft
picks it through `LoraConfig._register_custom_module`, which `prepare_lora_config` does (and
expands `target_modules="all-linear"`, which peft alone resolves only to `nn.Linear`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from peft import LoraConfig
from peft.tuners.lora import Linear as PeftLoraLinear
from torch import nn

from rlvr.quant import nvfp4


class _DequantizedLinear(torch.autograd.Function):
    """`x @ W.T + b` with W rebuilt from the packed tensors in forward and in backward.

    The base is frozen, so only the input gradient is needed; recomputing W for it costs one
    more dequantization per layer and saves keeping every layer's float weight alive between
    forward and backward.
    """

    @staticmethod
    def forward(ctx, x, weight_packed, weight_scale, weight_global_scale, bias):
        ctx.save_for_backward(weight_packed, weight_scale, weight_global_scale)
        weight = nvfp4.dequantize(weight_packed, weight_scale, weight_global_scale, x.dtype)
        output = F.linear(x, weight, bias)
        # With a bias, F.linear returns a view (of its 2-D addmm result). The layer is an FSDP2
        # unit, whose output must not be a view: an in-place op on it would drop the hook that
        # all-gathers the packed weight again for backward.
        return output.clone() if output._is_view() else output

    @staticmethod
    def backward(ctx, grad_output):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        weight = nvfp4.dequantize(*ctx.saved_tensors, grad_output.dtype)
        return grad_output @ weight, None, None, None, None


class NVFP4Linear(nn.Module):
    """Frozen `y = x W^T + b` with W stored NVFP4-packed; computes in `compute_dtype`."""

    def __init__(
        self,
        weight: nvfp4.NVFP4Weight,
        bias: torch.Tensor | None = None,
        input_global_scale: torch.Tensor | None = None,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.out_features, packed_columns = weight.weight_packed.shape
        self.in_features = 2 * packed_columns
        self.compute_dtype = compute_dtype
        # Frozen parameters, not buffers: FSDP2 shards parameters only (see rlvr.training.policy.shard).
        self.weight_packed = nn.Parameter(weight.weight_packed, requires_grad=False)
        self.weight_scale = nn.Parameter(weight.weight_scale, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(compute_dtype), requires_grad=False)
        # one float each: replicated, since sharding them would save nothing
        self.register_buffer("weight_global_scale", weight.weight_global_scale.float())
        self.register_buffer("input_global_scale", input_global_scale)

    @property
    def qweight(self) -> torch.Tensor:
        """The packed weight under the name peft looks for to find a quantized layer's device."""
        return self.weight_packed

    def dequantized_weight(self) -> torch.Tensor:
        return nvfp4.dequantize(self.weight_packed, self.weight_scale, self.weight_global_scale, self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _DequantizedLinear.apply(
            x.to(self.compute_dtype), self.weight_packed, self.weight_scale, self.weight_global_scale, self.bias
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, nvfp4"


class NVFP4LoraLinear(PeftLoraLinear):
    """peft's LoRA Linear on an `NVFP4Linear` base: `base(x) + B(A(dropout(x))) * scaling`.

    peft knows the shape of an `nn.Linear` only, so it is given here; the device and dtype it
    finds through the base's `qweight` and `compute_dtype` (its GPTQ and bitsandbytes
    conventions). Merging would need a float base weight: merge into the dequantized weights
    (the export path), not in place.
    """

    def _get_in_out_features(self, module: nn.Module) -> tuple[int, int]:
        return module.in_features, module.out_features

    def merge(self, *args, **kwargs) -> None:
        raise NotImplementedError(
            "LoRA cannot be merged into an NVFP4-packed base in place; merge into the dequantized weights"
        )


def quantized_linear_names(model: nn.Module) -> list[str]:
    """Qualified names of the `NVFP4Linear` modules in `model`."""
    return [name for name, module in model.named_modules() if isinstance(module, NVFP4Linear)]


def prepare_lora_config(config: LoraConfig, model: nn.Module) -> LoraConfig:
    """Make `config` able to target the packed layers of `model`; returns the same object.

    Registers `NVFP4LoraLinear` for `NVFP4Linear`, and resolves `target_modules="all-linear"`
    to the leaf names of every `nn.Linear` and `NVFP4Linear` except the output head: peft's own
    rule for "all-linear" would miss the packed layers, and on transformers-5 MoE models it also
    targets the fused 3-D expert and router parameters, an adapter vLLM cannot serve.
    """
    config._register_custom_module({NVFP4Linear: NVFP4LoraLinear})
    if isinstance(config.target_modules, str) and config.target_modules.lower() == "all-linear":
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        config.target_modules = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, module in model.named_modules()
                if isinstance(module, (nn.Linear, NVFP4Linear)) and module is not head
            }
        )
    return config
