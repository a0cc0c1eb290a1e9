"""MoE experts whose frozen weights stay NVFP4-packed, computed through transformers' ExpertsInterface.

transformers 5 fuses a layer's routed experts into one module with 3-D parameters and
dispatches its forward `(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`
through `ExpertsInterface` by `config._experts_implementation`, as it dispatches attention
(rlvr.models.moe). rlvr registers one implementation, `rlvr_experts`, and keeps the
transformers experts module (its activation, `_apply_gate`, layout flags): a packed module has
its fused float parameters replaced by, for each projection `P` (`gate_up_proj` or `up_proj`,
and `down_proj`):

- `P_weight_packed` uint8 `[E, out, in/2]` (held as float16, rlvr.quant.packed_bytes) and `P_weight_scale` FP8 `[E, out, in/16]`: each
  expert's rows in the compressed-tensors NVFP4 layout of a Linear (rlvr.quant.nvfp4), always
  `[out, in]` as on disk, whatever the float layout (`is_transposed`);
- `P_weight_global_scale` float32 `[E, parts]`: one global scale per on-disk projection; a
  fused `gate_up_proj` has two parts per expert (gate rows, then up rows);
- `P_input_global_scale` float32 `[E, parts]`, kept so that a re-saved checkpoint is complete.

The forward loops over the experts that received tokens only. Each dequantizes its own rows
inside the layer, and again in backward instead of keeping the float weight
(`rlvr.quant.linear.dequantized_linear`); experts nobody routed to cost nothing. Packed tensors
are frozen parameters (FSDP2 shards them, dim 0 = experts, so each rank holds E/N experts'
bytes); global scales are buffers. The same implementation computes unpacked (float) experts,
so that one code path serves a float base, a packed one, and LoRA on either.

LoRA on routed experts (`ExpertsLora`) is peft's `ParamWrapper` for 3-D expert parameters,
same parameters and names (`lora_A` `[r·E, in]`, `lora_B` `[out, r·E]`: one rank-r pair per
expert), nested the way peft nests `target_parameters=["down_proj", "gate_up_proj"]`, so the
adapter file is peft's and vLLM's MoE LoRA format. peft's wrapper adds the delta to the whole
float parameter before the forward; rlvr's adds `B_e A_e x` inside the per-expert loop, for
the experts hit, on packed weights.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from peft.tuners.lora import ParamWrapper
from torch import nn

from rlvr.models.moe import expert_projections, is_experts_module
from rlvr.quant import nvfp4
from rlvr.quant.linear import QuantizedLinear, dequantized_linear
from rlvr.quant.packed_bytes import as_bytes, frozen_bytes

NAME = "rlvr_experts"
PACKED_SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")

# (id(experts module), projection) -> [(A [E, r, in], B [E, out, r], scaling)], set by the
# ExpertsLora wrappers around the experts call they wrap
_ACTIVE_LORA: contextvars.ContextVar[dict] = contextvars.ContextVar("rlvr_expert_lora", default={})


@dataclass(frozen=True)
class NVFP4Experts:
    """One fused projection of E experts, each expert's `[out, in]` rows NVFP4-packed."""

    weight_packed: torch.Tensor  # uint8 [E, out, in/2]
    weight_scale: torch.Tensor  # float8_e4m3fn [E, out, in/16]
    weight_global_scale: torch.Tensor  # float32 [E, parts]
    input_global_scale: torch.Tensor  # float32 [E, parts]

    def expert(self, index: int) -> nvfp4.NVFP4Weight:
        """Expert `index` as one NVFP4 weight, its global scale given per row (`[out, 1]`)."""
        rows = self.weight_packed.shape[1]  # the same in bytes and in their float16 view
        global_scale = self.weight_global_scale[index].repeat_interleave(rows // self.weight_global_scale.shape[1])
        return nvfp4.NVFP4Weight(self.weight_packed[index], self.weight_scale[index], global_scale.unsqueeze(1))


def is_packed_experts(module: nn.Module) -> bool:
    """Whether `module` is an experts module holding NVFP4-packed projections."""
    return is_experts_module(module) and hasattr(module, f"{expert_projections(module)[1]}_weight_packed")


def pack_experts(module: nn.Module, projections: dict[str, NVFP4Experts], compute_dtype: torch.dtype) -> None:
    """Replace the fused float parameters of a transformers experts module by packed ones,
    dequantized to `compute_dtype` when they compute."""
    module.compute_dtype = compute_dtype
    for name, packed in projections.items():
        if name in module._parameters:
            delattr(module, name)
        module.register_parameter(f"{name}_weight_packed", frozen_bytes(packed.weight_packed))
        module.register_parameter(f"{name}_weight_scale", nn.Parameter(packed.weight_scale, requires_grad=False))
        module.register_buffer(f"{name}_weight_global_scale", packed.weight_global_scale.float())
        module.register_buffer(f"{name}_input_global_scale", packed.input_global_scale.float())


def packed_projection(module: nn.Module, name: str) -> NVFP4Experts:
    return NVFP4Experts(*(getattr(module, f"{name}_{suffix}") for suffix in PACKED_SUFFIXES))


def _project(module: nn.Module, name: str, expert: int, x: torch.Tensor, lora: dict) -> torch.Tensor:
    """`x @ W_e^T (+ b_e) (+ s · B_e A_e x)` for projection `name` of expert `expert`."""
    bias = getattr(module, f"{name}_bias")[expert] if module.has_bias else None
    if hasattr(module, f"{name}_weight_packed"):
        weight = packed_projection(module, name).expert(expert)
        y = dequantized_linear(
            x, bias, nvfp4.dequantize, weight.weight_packed, weight.weight_scale, weight.weight_global_scale
        )
    else:
        weight = getattr(module, name)[expert]
        y = F.linear(x, weight.T if module.is_transposed else weight, bias)
    for lora_a, lora_b, scaling in lora.get((id(module), name), ()):
        y = y + (x @ lora_a[expert].T) @ lora_b[expert].T * scaling
    return y


def expert_hidden(module: nn.Module, expert: int, x: torch.Tensor, lora: dict | None = None) -> torch.Tensor:
    """The input of expert `expert`'s down projection for tokens `x`: its gated (or activated)
    first projection. Packed rows sit where the fused float rows were, so the module's own
    gating applies."""
    h = _project(module, expert_projections(module)[0], expert, x, lora or {})
    return module._apply_gate(h) if module.has_gate else module.act_fn(h)


def experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' experts signature: for each expert that received tokens, its gated MLP on
    those tokens, weighted by their routing weights and summed into each token's output."""
    down = expert_projections(self)[1]
    lora = _ACTIVE_LORA.get()
    out = torch.zeros_like(hidden_states)
    for expert in torch.unique(top_k_index).tolist():
        if not 0 <= expert < self.num_experts:  # expert-parallel sentinels
            continue
        token_index, slot = torch.where(top_k_index == expert)
        h = expert_hidden(self, expert, hidden_states[token_index], lora)
        y = _project(self, down, expert, h, lora) * top_k_weights[token_index, slot, None]
        out.index_add_(0, token_index, y.to(out.dtype))
    return out


def use_rlvr_experts(model: nn.Module) -> bool:
    """Dispatch `model`'s experts through `experts_forward`; False if it has no experts interface."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if not any(is_experts_module(m) for m in model.modules()):
        return False
    ALL_EXPERTS_FUNCTIONS.register(NAME, experts_forward)
    model.set_experts_implementation(NAME)
    return model.config._experts_implementation == NAME


def packed_experts_names(model: nn.Module) -> list[str]:
    """Qualified names of the packed experts modules in `model`."""
    return [name for name, module in model.named_modules() if is_packed_experts(module)]


def packed_base_bytes(model: nn.Module) -> int:
    """Bytes of storage this process holds for the packed base between steps: the packed
    Linears' and experts' tensors (under FSDP2 its own shards, padding included) and their
    replicated global scales."""
    from torch.distributed.tensor import DTensor

    storages = {}
    for module in model.modules():
        if isinstance(module, QuantizedLinear) or is_packed_experts(module):
            for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                storage = (tensor.to_local() if isinstance(tensor, DTensor) else tensor).untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


# --------------------------------------------------------------------------- LoRA


class ExpertsLora(ParamWrapper):
    """peft's LoRA on one fused expert projection, computed per routed expert in `experts_forward`.

    A peft `ParamWrapper` (same parameters, names, scaling, enable/disable), that instead of
    parametrizing the float 3-D parameter hands its factors to the experts call it wraps.
    """

    def get_param(self) -> torch.Tensor:
        """The projection's fused parameter, or for a packed one a zero-stride stand-in of its
        float shape `[E, out, in]`, compute dtype and device (peft reads only those). On a meta
        base (the sharded load's skeleton, rlvr.quant.skeleton) the stand-in is on the CPU: peft
        moves the adapter it built to this device, and the CPU is where it drew its values."""
        experts = self.get_base_layer()
        if is_packed_experts(experts):
            packed = as_bytes(getattr(experts, f"{self.parameter_name}_weight_packed"))
            num_experts, rows, packed_columns = packed.shape
            shape, dtype, device = (num_experts, rows, 2 * packed_columns), experts.compute_dtype, packed.device
        else:
            param = getattr(experts, self.parameter_name)
            if not param.is_meta:
                return param
            shape, dtype, device = param.shape, param.dtype, param.device
        # on the CPU, unless the pairs are being built on meta to be measured (add_experts_lora)
        measuring = torch.get_default_device().type == "meta"
        device = torch.device("cpu") if device.type == "meta" and not measuring else device
        return torch.zeros((), dtype=dtype, device=device).expand(shape)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        active = [a for a in self.active_adapters if a in self.lora_A]
        if self.disable_adapters or not active:
            return self.base_layer(x, *args, **kwargs)
        factors = []
        for adapter in active:
            lora_a = self.lora_A[adapter].weight.view(self.num_experts, -1, self.in_features)
            lora_b = self.lora_B[adapter].weight.view(self.out_features, -1, self.num_experts).permute(2, 0, 1)
            factors.append((lora_a, lora_b, self.scaling[adapter]))
        key = (id(self.get_base_layer()), self.parameter_name)
        token = _ACTIVE_LORA.set({**_ACTIVE_LORA.get(), key: factors})
        try:
            return self.base_layer(x, *args, **kwargs)
        finally:
            _ACTIVE_LORA.reset(token)

    def merge(self, *args, **kwargs) -> None:
        raise NotImplementedError(
            "expert LoRA is applied per routed expert; merge it into the dequantized weights (export)"
        )


def add_experts_lora(peft_model: nn.Module, adapter_name: str = "default", shapes_only: bool = False) -> list[str]:
    """Wrap every experts module of a peft model in `ExpertsLora` for both its projections,
    nested as peft nests them (the input-side projection innermost); returns the wrapped names.
    `shapes_only`: the pairs are built on the meta device, never drawn, for measuring a model
    (at the seed's 673B size they are 3.2 billion values).

    The experts must dispatch through `experts_forward` (`use_rlvr_experts`).
    """
    config = peft_model.peft_config[adapter_name]
    wrapped, targeted = [], set()
    for name, experts in list(peft_model.named_modules()):
        if not is_experts_module(experts):
            continue
        parent_name, _, child = name.rpartition(".")
        module = experts
        for projection in expert_projections(experts):
            with torch.device("meta") if shapes_only else contextlib.nullcontext():
                module = ExpertsLora(
                    module,
                    adapter_name,
                    parameter_name=projection,
                    config=config,
                    r=config.r,
                    lora_alpha=config.lora_alpha,
                )
            if shapes_only:  # the model's dtype, as peft's move to a real device would cast them
                module.lora_A.to(module.get_param().dtype)
                module.lora_B.to(module.get_param().dtype)
            targeted.add(projection)
        setattr(peft_model.get_submodule(parent_name), child, module)
        wrapped.append(name)
    config.target_parameters = sorted(targeted)  # what peft writes in adapter_config.json
    return wrapped
