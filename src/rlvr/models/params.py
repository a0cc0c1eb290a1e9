"""Total and active parameter counts of any transformers causal LM, from its config alone.

The model is built on the meta device (no memory, seconds even for a 675B config) and its
parameters counted by module, with no per-architecture formula: a routed experts module
(rlvr.models.moe) holds `num_experts` experts of which each token uses `top_k`, so it counts
in full towards the total and `top_k / num_experts` of it towards the active parameters
(DeepSeek-V3: 671B total, 37B active). Everything else (attention and MLA projections,
dense MLPs, shared experts, routers, norms, embeddings and the output head) is active for
every token. A tied output head counts once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlvr.models.moe import moe_layers
from rlvr.models.transformers_classes import causal_lm_from_config


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int  # used per token: everything but the routed experts, plus top_k of them per layer
    routed_experts: int  # all routed experts' weights, the part NVFP4 and expert sharding matter most for
    embeddings: int  # input embedding (and an untied output head)
    moe_layers: int
    num_experts: int  # routed experts per MoE layer (0 for a dense model)
    top_k: int


def count_parameters(model: nn.Module) -> ParamCounts:
    """Counts of an instantiated model (any device, meta included)."""
    unique = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in unique.values())
    layers = moe_layers(model)
    routed = sum(p.numel() for layer in layers for p in layer.experts.parameters())
    routed_active = sum(
        sum(p.numel() for p in layer.experts.parameters()) * layer.top_k // layer.num_experts for layer in layers
    )
    embedding_modules = [model.get_input_embeddings(), model.get_output_embeddings()]
    embeddings = sum(
        p.numel() for p in {id(p): p for m in embedding_modules if m is not None for p in m.parameters()}.values()
    )
    return ParamCounts(
        total=total,
        active=total - routed + routed_active,
        routed_experts=routed,
        embeddings=embeddings,
        moe_layers=len(layers),
        num_experts=layers[0].num_experts if layers else 0,
        top_k=layers[0].top_k if layers else 0,
    )


def parameter_counts(config) -> ParamCounts:
    """Counts of the causal LM a transformers config (`PretrainedConfig`) describes."""

    with torch.device("meta"):
        model = causal_lm_from_config(config)
    return count_parameters(model)
