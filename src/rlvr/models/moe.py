"""The mixture-of-experts layers of any transformers 5 model, found by transformers' own conventions.

No per-model code. transformers 5 gives every MoE model two hooks rlvr relies on:

- experts modules are classes decorated with `@use_experts_implementation`, which dispatch
  their forward `(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])` through the
  `ExpertsInterface` and carry the decorator's layout flags (`has_gate`, `has_bias`,
  `is_transposed`, `is_concatenated`) next to `num_experts` and the fused 3-D parameters
  (`gate_up_proj` [E, 2I, H] or `up_proj`, and `down_proj` [E, H, I]; [E, in, out] when transposed);
- the router of each layer is named by the model's `_can_record_outputs["router_logits"]`
  (the class whose first output is the router logits), and sits next to its experts in the
  MoE block. Routers pick experts with a top-k over `[T, num_experts]` scores.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch
from torch import nn

from rlvr.models.transformers_classes import causal_lm_from_config

_EXPERTS_FLAGS = ("has_gate", "has_bias", "is_transposed", "is_concatenated", "num_experts")


def is_experts_module(module: nn.Module) -> bool:
    """Whether `module` is a transformers experts module (`@use_experts_implementation`)."""
    return all(hasattr(module, flag) for flag in _EXPERTS_FLAGS)


def expert_projections(module: nn.Module) -> tuple[str, str]:
    """The names of the two fused projections of an experts module: (input side, output side)."""
    return ("gate_up_proj" if module.has_gate else "up_proj"), "down_proj"


@dataclass(frozen=True)
class MoELayer:
    """One MoE layer: its router and experts (qualified names and modules) and routing sizes."""

    router_name: str
    router: nn.Module
    experts_name: str
    experts: nn.Module
    top_k: int
    num_experts: int


def _router_classes(model: nn.Module) -> tuple[type, ...]:
    classes = set()
    for module in model.modules():
        recorder = (getattr(module, "_can_record_outputs", None) or {}).get("router_logits")
        target = getattr(recorder, "target_class", recorder)
        if isinstance(target, type):
            classes.add(target)
    return tuple(classes)


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """The model's MoE layers in forward order; a layer is an experts module and the router
    among its siblings. An experts module with no router beside it is an error naming it."""
    router_classes = _router_classes(model)
    names = {id(module): name for name, module in model.named_modules()}
    layers = []
    for parent in model.modules():
        if hasattr(parent, "get_base_layer"):  # a peft wrapper: its base is found from its own parent
            continue
        children = dict(parent.named_children())
        for child in children.values():
            # a LoRA'd experts module sits under peft wrappers (rlvr.quant.experts.ExpertsLora)
            experts = child.get_base_layer() if hasattr(child, "get_base_layer") else child
            if not is_experts_module(experts):
                continue
            routers = [m for m in children.values() if router_classes and isinstance(m, router_classes)]
            if len(routers) != 1:
                raise ValueError(
                    f"{type(model).__name__}: found {len(routers)} routers beside {names[id(experts)]} "
                    f"(looked for {', '.join(c.__name__ for c in router_classes) or 'a router_logits recorder'})"
                )
            router = routers[0]
            # the decorator keeps the model config on the experts module
            top_k = getattr(router, "top_k", None) or experts.config.num_experts_per_tok
            layers.append(
                MoELayer(names[id(router)], router, names[id(experts)], experts, int(top_k), int(experts.num_experts))
            )
    return layers


def moe_layer_numbers(config) -> list[int]:
    """The decoder-block index of each MoE layer, in forward order, from the model's transformers
    config alone (the model built on the meta device from a copy of it, no weights read). vLLM's
    routed experts have a row for every decoder block, dense ones included; these select rlvr's
    MoE layers."""
    with torch.device("meta"):
        model = causal_lm_from_config(copy.deepcopy(config))
    # every transformers decoder keeps its blocks in one ModuleList: the first index in a name is the block's
    return [int(re.search(r"\.(\d+)\.", layer.router_name).group(1)) for layer in moe_layers(model)]
