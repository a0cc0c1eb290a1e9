"""LoRA on Megatron's parallel linears, split as their base is, and gathered back into PEFT's names.

Megatron fuses what PEFT adapts one by one (q, k, v into `linear_qkv`; gate and up into
`linear_fc1`), so a fused layer carries one LoRA pair per PEFT target it holds, and only for the
targeted ones. On a column-parallel layer (its output split over the ranks) each pair's A is
whole on every rank and its B holds the rank's rows of that target's output; on a row-parallel
layer (its input split) A holds the rank's input columns and B is whole, the ranks' partial
products summed (Megatron's own split of a matrix product). The factors are PEFT's, drawn for
the same seed as an FSDP2 rank draws them (rlvr.training.megatron.rank), so both start equal.

Routed experts (`lora.target_experts`) carry PEFT's `target_parameters` pairs
(rlvr.quant.experts.ExpertsLora): per projection one `lora_A` `[r x E, in]` and one `lora_B`
`[out, r x E]`, expert e's pair being A's rows `e*r:(e+1)*r` and B's columns `e::E`. Each
expert-parallel rank puts its own experts' pairs on their `linear_fc1` (gate/up) and `linear_fc2`
(down), whole (an MoE model runs at tensor parallel 1), and gathers the others' to give PEFT's
tensors back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region, reduce_from_tensor_model_parallel_region
from megatron.core.transformer.moe.experts import SequentialMLP
from torch import nn

from rlvr.config import LoraConfig
from rlvr.training.megatron.weights import qkv_interleaved
from rlvr.training.policy import apply_lora
from rlvr.training.rank_weights import public_name

PEFT_LAYER = "base_model.model.model.layers.{layer}.{module}.{target}.lora_{factor}.weight"

# Megatron's fused layer -> (its HF module, the PEFT targets in the order of its output rows,
# the split: column-parallel splits the output, row-parallel the input); a layer a block lacks
# (MLA's in a dense model, shared experts in a dense layer) is passed over
QKV = ("q_proj", "k_proj", "v_proj")
FUSED = {
    "self_attention.linear_qkv": ("self_attn", QKV, "column"),
    "self_attention.linear_q_proj": ("self_attn", ("q_proj",), "column"),
    "self_attention.linear_q_down_proj": ("self_attn", ("q_a_proj",), "column"),
    "self_attention.linear_q_up_proj": ("self_attn", ("q_b_proj",), "column"),
    "self_attention.linear_kv_down_proj": ("self_attn", ("kv_a_proj_with_mqa",), "column"),
    "self_attention.linear_kv_up_proj": ("self_attn", ("kv_b_proj",), "column"),
    "self_attention.linear_proj": ("self_attn", ("o_proj",), "row"),
    "mlp.linear_fc1": ("mlp", ("gate_proj", "up_proj"), "column"),
    "mlp.linear_fc2": ("mlp", ("down_proj",), "row"),
    "mlp.shared_experts.linear_fc1": ("mlp.shared_experts", ("gate_proj", "up_proj"), "column"),
    "mlp.shared_experts.linear_fc2": ("mlp.shared_experts", ("down_proj",), "row"),
}

# a routed expert's Megatron linear -> its PEFT projection, and the PEFT nesting of that
# projection's pair: the input side innermost (rlvr.quant.experts.add_experts_lora)
EXPERT_PAIRS = {"linear_fc1": ("gate_up_proj", "base_layer."), "linear_fc2": ("down_proj", "")}
PEFT_EXPERTS = "base_model.model.model.layers.{layer}.mlp.experts.{nest}lora_{factor}.weight"

Fuse = Callable[[list[torch.Tensor]], torch.Tensor]  # each target's output rows -> the fused layer's


class LoraLinear(nn.Module):
    """A Megatron parallel linear plus one LoRA pair per adapted PEFT target it fuses. `rows`: each
    target's output rows on this rank (column-parallel), for the targets left unadapted."""

    def __init__(
        self,
        base: nn.Module,
        row_parallel: bool,
        factors: dict[str, tuple[torch.Tensor, torch.Tensor]],
        rows: dict[str, int],
        fuse: Fuse,
        scaling: float,
    ):
        super().__init__()
        self.base, self.row_parallel, self.rows, self.fuse, self.scaling = base, row_parallel, rows, fuse, scaling
        self.lora_A = nn.ParameterDict({t: nn.Parameter(a.float()) for t, (a, _) in factors.items()})
        self.lora_B = nn.ParameterDict({t: nn.Parameter(b.float()) for t, (_, b) in factors.items()})
        for p in (self.lora_A if row_parallel else self.lora_B).values():
            p.tensor_model_parallel = True  # split over the ranks: its gradient norm adds up over them
        self.enabled = True

    def forward(self, x: torch.Tensor):
        out, bias = self.base(x)
        if not self.enabled:
            return out, bias
        if self.row_parallel:  # x holds this rank's input columns: the ranks' partial products add up
            ((target, a),) = self.lora_A.items()
            inner = reduce_from_tensor_model_parallel_region(x @ a.to(x.dtype).T)
            return out + inner @ self.lora_B[target].to(x.dtype).T * self.scaling, bias
        parts = []
        for target, size in self.rows.items():
            if target not in self.lora_A:
                parts.append(out.new_zeros(*out.shape[:-1], size))
                continue
            # A is whole on every rank: its gradient adds up over the ranks' rows of B
            inner = copy_to_tensor_model_parallel_region(x @ self.lora_A[target].to(x.dtype).T)
            parts.append(inner @ self.lora_B[target].to(x.dtype).T * self.scaling)
        return out + self.fuse(parts), bias


def peft_factors(model: nn.Module, lora: LoraConfig, shapes_only: bool = False) -> tuple[nn.Module, dict]:
    """(PEFT's model, its factors by PEFT's public names): the factors an FSDP2 rank draws for
    `lora` on the same skeleton (the caller seeds the draw), or with `shapes_only` their shapes."""
    peft = apply_lora(model, **lora.model_dump(), shapes_only=shapes_only)
    return peft, {public_name(n): p.detach() for n, p in peft.named_parameters() if p.requires_grad}


def attach_lora(gpt: GPTModel, peft: dict[str, torch.Tensor], shape, scaling: float) -> None:
    """Put a LoraLinear around each Megatron linear that fuses a PEFT target in `peft` (PEFT's
    whole tensors by name), keeping this rank's part of each factor. `shape`: the model's
    (rlvr.training.megatron.gpt.DenseShape or .mla.LatentShape)."""
    rank, ranks = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()
    unplaced = set(peft)
    for layer, block in enumerate(gpt.decoder.layers):
        for path, (module, targets, split) in FUSED.items():
            base = _linear(block, path)
            if base is None:
                continue
            names = {t: PEFT_LAYER.format(layer=layer, module=module, target=t, factor="{}") for t in targets}
            adapted = [t for t in targets if names[t].format("A") in peft]
            if not adapted:
                continue
            factors = {}
            for t in adapted:
                a, b = peft[names[t].format("A")], peft[names[t].format("B")]
                unplaced -= {names[t].format("A"), names[t].format("B")}
                if split == "row":
                    a = a.chunk(ranks, dim=1)[rank]
                else:
                    b = b.chunk(ranks, dim=0)[rank]
                factors[t] = (a.clone(), b.clone())
            if targets == QKV:
                q, kv = shape.heads * shape.head_dim // ranks, shape.groups * shape.head_dim // ranks
                rows, fuse = dict(zip(QKV, (q, kv, kv))), _fuse_qkv(shape.groups // ranks)
            else:  # gate and up halves, or one target: the rank's output rows
                rows, fuse = {t: base.get_parameter("weight").shape[0] // len(targets) for t in targets}, _concat
            owner, attr = block.get_submodule(path.rsplit(".", 1)[0]), path.rsplit(".", 1)[1]
            setattr(owner, attr, LoraLinear(base, split == "row", factors, rows, fuse, scaling))
        unplaced -= _attach_expert_lora(layer, block, peft, scaling)
    if unplaced:
        raise ValueError(f"trainer.lora.target_modules: no Megatron layer holds {sorted(unplaced)[0]}")


def _attach_expert_lora(layer: int, block: nn.Module, peft: dict[str, torch.Tensor], scaling: float) -> set[str]:
    """Put each of this rank's routed experts' PEFT pairs on its linears; returns the names placed."""
    experts = _routed_experts(block)
    placed: set[str] = set()
    if experts is None:
        return placed
    local, count = experts.local_experts, experts.config.num_moe_experts
    first = parallel_state.get_expert_model_parallel_rank() * len(local)
    for linear, (projection, nest) in EXPERT_PAIRS.items():
        name = PEFT_EXPERTS.format(layer=layer, nest=nest, factor="{}")
        if name.format("A") not in peft:
            continue
        a, b = peft[name.format("A")], peft[name.format("B")]
        placed |= {name.format("A"), name.format("B")}
        a_per, b_per = a.view(count, -1, a.shape[1]), b.view(b.shape[0], -1, count)
        for index, expert in enumerate(local):
            base = getattr(expert, linear)
            pair = (a_per[first + index].clone(), b_per[:, :, first + index].clone())
            lora = LoraLinear(base, False, {projection: pair}, {projection: b.shape[0]}, _concat, scaling)
            for param in (*lora.lora_A.values(), *lora.lora_B.values()):
                param.data = param.data.to(a.dtype)  # the model's dtype, as an FSDP2 rank's ExpertsLora
                param.tensor_model_parallel = False  # whole on the rank
                param.allreduce = False  # this expert-parallel rank's own expert's (megatron-core's mark)
            setattr(expert, linear, lora)
    return placed


def _routed_experts(block: nn.Module) -> SequentialMLP | None:
    """A block's routed experts (megatron-core's SequentialMLP, the local spec's), None in a dense block."""
    experts = getattr(getattr(block, "mlp", None), "experts", None)
    return experts if isinstance(experts, SequentialMLP) else None


def _linear(block: nn.Module, path: str) -> nn.Module | None:
    """The block's layer at `path`, None where the block has none."""
    try:
        return block.get_submodule(path)
    except AttributeError:
        return None


def _fuse_qkv(groups: int) -> Fuse:
    def fuse(parts: list[torch.Tensor]) -> torch.Tensor:
        q, k, v = (p.movedim(-1, 0) for p in parts)
        return qkv_interleaved(q, k, v, groups).movedim(0, -1)

    return fuse


def _concat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=-1)


def peft_tensors(gpt: GPTModel) -> dict[str, torch.Tensor]:
    """Every LoRA factor whole, under PEFT's names (each rank of a tensor-parallel group gets them)."""
    group = parallel_state.get_tensor_model_parallel_group()
    out = {}
    for layer, block in enumerate(gpt.decoder.layers):
        for path, (module, _, split) in FUSED.items():
            lora = _linear(block, path)
            if not isinstance(lora, LoraLinear):
                continue
            for target in lora.lora_A:
                name = PEFT_LAYER.format(layer=layer, module=module, target=target, factor="{}")
                a, b = lora.lora_A[target].detach(), lora.lora_B[target].detach()
                if split == "row":
                    a = _gathered(a, 1, group)
                else:
                    b = _gathered(b, 0, group)
                out[name.format("A")], out[name.format("B")] = a.cpu(), b.cpu()
        out |= _expert_tensors(layer, block)
    return out


def _expert_tensors(layer: int, block: nn.Module) -> dict[str, torch.Tensor]:
    """A block's routed-expert pairs in PEFT's layout, every expert-parallel rank's experts gathered."""
    experts = _routed_experts(block)
    out: dict[str, torch.Tensor] = {}
    if experts is None:
        return out
    group = parallel_state.get_expert_model_parallel_group()
    for linear, (projection, nest) in EXPERT_PAIRS.items():
        pairs = [getattr(expert, linear) for expert in experts.local_experts]
        if not isinstance(pairs[0], LoraLinear):
            continue
        a = _gathered(torch.stack([p.lora_A[projection].detach() for p in pairs]), 0, group)  # [E, r, in]
        b = _gathered(torch.stack([p.lora_B[projection].detach() for p in pairs], dim=-1), 2, group)  # [out, r, E]
        name = PEFT_EXPERTS.format(layer=layer, nest=nest, factor="{}")
        out[name.format("A")], out[name.format("B")] = a.flatten(0, 1).cpu(), b.flatten(1, 2).cpu()
    return out


def _gathered(part: torch.Tensor, dim: int, group) -> torch.Tensor:
    parts = [torch.empty_like(part) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, part.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """The base alone (the KL term's reference), as peft's `disable_adapter`."""
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    for layer in layers:
        layer.enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.enabled = True
