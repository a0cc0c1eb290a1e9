"""Frozen Linears whose weight stays 4-bit packed (NVFP4 or NF4), and the peft LoRA layers rlvr trains.

`QuantizedLinear` is the shared part: a subclass names its packed tensors (`packed_names`, in
the order its `quant_format` module's `dequantize` takes them) and stores them; forward,
backward and LoRA are the same for every format.

Packed tensors and the bias are frozen parameters, which FSDP2 shards across the trainer
ranks (it shards parameters, never buffers); one-float scales stay buffers, replicated, since
sharding them would save nothing. The float weight exists only while one layer computes: the
autograd function below dequantizes in forward and again in backward instead of saving it, so
training memory holds the packed bytes (~0.56 byte per weight), not a float copy per layer.

`NVFP4Linear` keeps `weight_packed` (uint8 bytes, held as float16: rlvr.quant.packed_bytes), `weight_scale` (FP8), `weight_global_scale` (and
`input_global_scale`, kept only so a re-saved checkpoint stays complete), named as in the
checkpoint, so `state_dict()` is the compressed-tensors layout; the trainer's checkpoints, which
skip frozen parameters, skip the packed base.

`NF4Linear` keeps `weight_packed` (uint8 bytes as float16) and `weight_absmax` (float32), see `rlvr.quant.nf4`;
the checkpoint I/O maps them to bitsandbytes' keys.

LoRA: `FusedLoraLinear` is peft's `lora.Linear` with the update added inside one matmul, on an
`nn.Linear` base; `QuantizedLoraLinear` the same on a `QuantizedLinear` base. peft picks them
through `LoraConfig._register_custom_module`, which `prepare_lora_config` does (and expands
`target_modules="all-linear"`, which peft alone resolves only to `nn.Linear`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from peft import LoraConfig
from peft.tuners.lora import Linear as PeftLoraLinear
from torch import nn

from rlvr.quant import nf4, nvfp4
from rlvr.quant.packed_bytes import frozen_bytes


class _DequantizedLinear(torch.autograd.Function):
    """`x @ W.T + b` with W rebuilt by `dequantize(*packed, dtype)` in forward and in backward.

    The base is frozen, so only the input gradient is needed; recomputing W for it costs one
    more dequantization per layer and saves keeping every layer's float weight alive between
    forward and backward.
    """

    @staticmethod
    def forward(ctx, x, bias, dequantize, *packed):
        ctx.dequantize = dequantize
        ctx.save_for_backward(*packed)
        weight = dequantize(*packed, x.dtype)
        output = F.linear(x, weight, bias)
        # With a bias, F.linear returns a view (of its 2-D addmm result). The layer is an FSDP2
        # unit, whose output must not be a view: an in-place op on it would drop the hook that
        # all-gathers the packed weight again for backward.
        return output.clone() if output._is_view() else output

    @staticmethod
    def backward(ctx, grad_output):
        # read once: under non-reentrant activation checkpointing a second read of saved_tensors
        # is an error (torch.utils.checkpoint: "Unpack is being triggered for a tensor that was
        # already unpacked once")
        packed = ctx.saved_tensors
        no_grads = (None,) * (2 + len(packed))
        if not ctx.needs_input_grad[0]:
            return (None, *no_grads)
        weight = ctx.dequantize(*packed, grad_output.dtype)
        return (grad_output @ weight, *no_grads)


def dequantized_linear(x: torch.Tensor, bias: torch.Tensor | None, dequantize, *packed: torch.Tensor) -> torch.Tensor:
    """`x @ W.T + b` for a frozen W = `dequantize(*packed, x.dtype)`, rebuilt in backward, never kept."""
    return _DequantizedLinear.apply(x, bias, dequantize, *packed)


class QuantizedLinear(nn.Module):
    """Frozen `y = x W^T + b` with W stored packed; computes in `compute_dtype`.

    Subclasses set `quant_format` (a module with `dequantize(*packed, dtype)`), `packed_names`
    (the attributes holding its packed tensors, in `dequantize`'s order, the packed bytes
    first), `in_features`, `out_features`, `compute_dtype` and `bias`.
    """

    quant_format = None
    packed_names: tuple[str, ...] = ()

    def packed_tensors(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.packed_names]

    @property
    def qweight(self) -> torch.Tensor:
        """The packed weight under the name peft looks for to find a quantized layer's device."""
        return getattr(self, self.packed_names[0])

    def dequantized_weight(self) -> torch.Tensor:
        return self.quant_format.dequantize(*self.packed_tensors(), self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dequantized_linear(
            x.to(self.compute_dtype), self.bias, self.quant_format.dequantize, *self.packed_tensors()
        )

    def extra_repr(self) -> str:
        name = self.quant_format.__name__.rsplit(".", 1)[-1]
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {name}"


class NVFP4Linear(QuantizedLinear):
    """Frozen `y = x W^T + b` with W stored NVFP4-packed; computes in `compute_dtype`."""

    quant_format = nvfp4
    packed_names = ("weight_packed", "weight_scale", "weight_global_scale")

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
        self.weight_packed = frozen_bytes(weight.weight_packed)
        self.weight_scale = _frozen(weight.weight_scale)
        self.bias = None if bias is None else _frozen(bias.to(compute_dtype))
        self.register_buffer("weight_global_scale", weight.weight_global_scale.float())
        self.register_buffer("input_global_scale", input_global_scale)


class NF4Linear(QuantizedLinear):
    """Frozen `y = x W^T + b` with W stored NF4-packed (bitsandbytes' codebook and blocks)."""

    quant_format = nf4
    packed_names = ("weight_packed", "weight_absmax")

    def __init__(
        self, weight: nf4.NF4Weight, bias: torch.Tensor | None = None, compute_dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.out_features, packed_columns = weight.weight_packed.shape
        self.in_features = 2 * packed_columns
        self.compute_dtype = compute_dtype
        self.weight_packed = frozen_bytes(weight.weight_packed)
        self.weight_absmax = _frozen(weight.weight_absmax.float())
        self.bias = None if bias is None else _frozen(bias.to(compute_dtype))


def _frozen(tensor: torch.Tensor) -> nn.Parameter:
    """A parameter FSDP2 shards (see rlvr.training.policy.shard) but no optimizer updates."""
    return nn.Parameter(tensor, requires_grad=False)


class FusedLoraLinear(PeftLoraLinear):
    """peft's LoRA Linear, `base(x) + scaling * B(A(dropout(x)))`, with the update added by the
    matmul itself: `addmm(base(x), A(dropout(x)), Bᵀ, alpha=scaling)`. peft's `... * scaling`
    and `+` are two more passes over the `[tokens, out_features]` output in forward and one in
    backward; on the CPU demo's trainer they were ~10% of a step. The same parameters, names and
    adapters as peft's; whatever else peft's forward handles (disabled or merged adapters,
    several active ones, DoRA and other variants, extra arguments) it still does.
    """

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        adapter = self.active_adapters[0] if len(self.active_adapters) == 1 else None
        if (
            self.disable_adapters
            or self.merged
            or args
            or kwargs
            or adapter not in self.lora_A
            or adapter in self.lora_variant
        ):
            return super().forward(x, *args, **kwargs)
        result = self.base_layer(x)
        lora_b = self.lora_B[adapter]
        down = self.lora_A[adapter](
            self.lora_dropout[adapter](self._cast_input_dtype(x, self.lora_A[adapter].weight.dtype))
        )
        scaling = self.scaling[adapter]
        if result.dtype != down.dtype:  # peft's way: the update in LoRA's dtype, the sum in the output's
            return (result + lora_b(down) * scaling).to(result.dtype)
        fused = torch.addmm(
            result.reshape(-1, result.shape[-1]), down.reshape(-1, down.shape[-1]), lora_b.weight.t(), alpha=scaling
        )
        return fused.view(result.shape)


class QuantizedLoraLinear(FusedLoraLinear):
    """peft's LoRA Linear on a `QuantizedLinear` base (fused as `FusedLoraLinear`).

    peft knows the shape of an `nn.Linear` only, so it is given here; the device and dtype it
    finds through the base's `qweight` and `compute_dtype` (its GPTQ and bitsandbytes
    conventions). Merging would need a float base weight: merge into the dequantized weights
    (the export path), not in place.
    """

    def _get_in_out_features(self, module: nn.Module) -> tuple[int, int]:
        return module.in_features, module.out_features

    def merge(self, *args, **kwargs) -> None:
        raise NotImplementedError(
            "LoRA cannot be merged into a 4-bit packed base in place; merge into the dequantized weights"
        )


_PATCHING_PEFT = threading.RLock()  # held while peft's functions are patched (also by rlvr.training.policy's)


@contextmanager
def peft_targets_as_given() -> Iterator[None]:
    """While active, peft injects LoRA exactly where the config's targets say.

    peft rewrites the config of a transformers-5 MoE model (Qwen-MoE and DeepSeek types) as if
    it were a transformers-4 adapter (`convert_peft_config_for_transformers`): every target named
    `gate_proj`/`up_proj`/`down_proj` also becomes the fused routed-expert parameter, with the rank
    doubled for `gate_up_proj`, a LoRA vLLM cannot serve; peft 0.21 also drops those names from
    `target_modules`, so the dense MLPs and shared experts that carry them lose their LoRA. rlvr
    resolves its targets against the loaded model itself (`prepare_lora_config`,
    `rlvr.quant.experts.add_experts_lora`), so the rewrite only moves LoRA where the config does not
    put it; it is a no-op while this is active. Wrap every `get_peft_model` on a trainer or engine
    model whose adapter must match the trainer's.
    """
    from peft.utils import transformers_weight_conversion

    # one patcher at a time: engine replicas build their LoRA models in threads, and a second
    # patcher would save the first one's patch as "the original" and leave it in place for good
    with _PATCHING_PEFT:
        original = transformers_weight_conversion.convert_peft_config_for_transformers
        transformers_weight_conversion.convert_peft_config_for_transformers = lambda *args, **kwargs: None
        try:
            yield
        finally:
            transformers_weight_conversion.convert_peft_config_for_transformers = original


def quantized_linear_names(model: nn.Module) -> list[str]:
    """Qualified names of the `QuantizedLinear` modules (any format) in `model`."""
    return [name for name, module in model.named_modules() if isinstance(module, QuantizedLinear)]


def prepare_lora_config(config: LoraConfig, model: nn.Module) -> LoraConfig:
    """Make `config` able to target the packed layers of `model`; returns the same object.

    Registers `QuantizedLoraLinear` for `QuantizedLinear` and `FusedLoraLinear` for `nn.Linear`, and resolves `target_modules="all-linear"`
    to the leaf names of every `nn.Linear` and `QuantizedLinear` except the output head: peft's own
    rule for "all-linear" would miss the packed layers, and on transformers-5 MoE models it also
    targets the fused 3-D expert and router parameters, an adapter vLLM cannot serve.
    """
    config._register_custom_module({QuantizedLinear: QuantizedLoraLinear, nn.Linear: FusedLoraLinear})
    if isinstance(config.target_modules, str) and config.target_modules.lower() == "all-linear":
        config.target_modules = all_linear_names(model)
    return config


def all_linear_names(model: nn.Module) -> list[str]:
    """What `target_modules="all-linear"` adapts: the leaf names of every `nn.Linear` and
    `QuantizedLinear` of `model` except the output head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, (nn.Linear, QuantizedLinear)) and module is not head
        }
    )
