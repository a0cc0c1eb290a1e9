"""A trainer rank's bytes on its device between steps, by the layout of trainer.backend: one walk
over the parameters of rlvr.planning.architecture's `units`, each counted at the share the rank holds.

    rank_bytes(cfg, rank)            # FSDP2: base_shard, gathered, trainable, optimizer
    megatron_rank_bytes(cfg, rank)   # Megatron: base_shard, trainable, optimizer

FSDP2 (`fully_shard`) splits every parameter along dim 0 over the shard group
(trainer.shard_ranks ranks, all of them by default; with HSDP each replica holds a whole copy)
as torch.chunk does: c = ceil(rows / shards) rows each, shard s holding max(0, min(c, rows - s x
c)) (rank r is shard r % shard_ranks: ranks are laid out replica by replica), and gathers two
blocks whole while it runs (rlvr.planning.plan's doc-string).

Megatron holds its part of each tensor whole, nothing gathered. Rank r sits in megatron-core's
default order (tp-cp-ep-dp-pp, tensor parallel fastest): tensor rank r % TP, expert rank
(r // TP) % EP, pipeline stage r // (ranks / PP). Tensor parallel splits each tensor as
rlvr.planning.params says (the same chunk rule, exact where TP divides, as Megatron requires);
expert parallel gives each rank E / EP routed experts; stage s holds decoder layers
[s x L / PP, (s + 1) x L / PP) in order (the dense leading layers first), the first stage the
embeddings, the last the final norm and LM head (with tied embeddings and PP > 1, a copy of the
embeddings as its head); the data-parallel replicas each hold the same. LoRA's factors are
split as their base; trainable counts value and gradient, optimizer AdamW's two moments, both of
the rank's own factors (no distributed optimizer). A 4-bit base (NVFP4, NF4) counts at the compute
dtype: the Megatron rank reads it dequantized (it has no packed linears; TransformerEngine's
NVFP4 would keep it packed on GPUs), which `rlvr rehearse` measures on its module tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rlvr.config import MegatronConfig
from rlvr.planning.architecture import GB, Architecture, compute_bytes, read_architecture
from rlvr.planning.params import ParamShape, Unit
from rlvr.planning.sections import PlanSections

# A CPU trainer rank's private memory before it builds its policy: the interpreter, torch,
# transformers and peft imported, its gloo group up (measured: 0.33 GB, torch 2.13, transformers 5.19)
CPU_RANK_PROCESS_BYTES = 0.33 * GB


def shard_rows(rows: int, shards: int, index: int) -> int:
    """Rows of a `rows`-row tensor on shard `index` of `shards`, as FSDP2 splits dim 0 (torch.chunk)."""
    chunk = -(-rows // shards)
    return max(0, min(chunk, rows - index * chunk))


def rank_bytes(cfg: PlanSections, rank: int, arch: Architecture | None = None) -> dict[str, float]:
    """Trainer rank `rank`'s bytes under FSDP2's chunk rule: base_shard, gathered, trainable, optimizer."""
    arch = arch or read_architecture(cfg)
    shards = cfg.trainer.shard_ranks or cfg.trainer.ranks

    def held(unit: Unit, param: ParamShape) -> float:
        return unit.count * shard_rows(param.rows, shards, rank % shards) * param.row_elements

    return {"gathered": 2 * arch.block_bytes(compute_bytes(cfg), cfg.trainer.lora)} | _walk(cfg, arch, held)


def megatron_rank_bytes(cfg: PlanSections, rank: int, arch: Architecture | None = None) -> dict[str, float]:
    """Trainer rank `rank`'s bytes under Megatron's tensor/expert/pipeline layout (trainer.megatron):
    base_shard, trainable, optimizer."""
    arch = replace(arch or read_architecture(cfg), nvfp4=False)  # read dequantized
    layout = cfg.trainer.megatron
    tp, ep, pp = layout.tensor_parallel, layout.expert_parallel, layout.pipeline_parallel
    tensor, expert, stage = rank % tp, rank // tp % ep, rank // (cfg.trainer.ranks // pp)
    on_stage, start, layers = stage_layers(arch.num_layers, pp, stage), 0, {}
    for unit in arch.units(compute_bytes(cfg), cfg.trainer.lora):
        if unit.is_block:  # the dense leading layers, then the MoE ones
            layers[unit.name], start = range(start, start + unit.count), start + unit.count
    last = stage == pp - 1

    def held(unit: Unit, param: ParamShape) -> float:
        if unit.is_block:
            count = len(range(max(on_stage.start, layers[unit.name].start), min(on_stage.stop, layers[unit.name].stop)))
        elif param.stage == "first":  # the embeddings; tied and pipelined, the last stage's head is a copy
            count = (stage == 0) + (arch.tie_word_embeddings and pp > 1 and last)
        else:
            count = last
        rows = shard_rows(param.rows, ep, expert) if param.experts == "rows" else param.rows
        elements = shard_rows(param.row_elements, ep, expert) if param.experts == "row_elements" else param.row_elements
        if param.tensor_split == "rows":
            return count * shard_rows(rows, tp, tensor) * elements
        split = param.tensor_split == "row_elements"
        return count * rows * (shard_rows(elements, tp, tensor) if split else elements)

    return _walk(cfg, arch, held)


def megatron_misfit(arch: Architecture, layout: MegatronConfig) -> str | None:
    """Why megatron-core would refuse `layout` for this model (a size it does not divide), or None."""
    sizes = [("pipeline_parallel", layout.pipeline_parallel, "decoder layers", arch.num_layers)]
    tp = layout.tensor_parallel
    sizes += [
        ("tensor_parallel", tp, "attention heads", arch.num_heads),
        ("tensor_parallel", tp, "vocab_size", arch.vocab_size),
    ]
    if arch.mla is None:
        sizes.append(("tensor_parallel", tp, "key/value heads", arch.num_kv_heads))
    if arch.num_layers > arch.moe_layers:
        sizes.append(("tensor_parallel", tp, "intermediate_size", arch.intermediate_size))
    if arch.experts:
        sizes += [
            ("tensor_parallel", tp, "expert width", arch.experts.width),
            ("expert_parallel", layout.expert_parallel, "routed experts", arch.experts.count),
        ]
    for key, parts, what, size in sizes:
        if size % parts:
            return f"trainer.megatron.{key}={parts} must divide the model's {what} ({size})"
    return None


def trainer_memory(
    cfg: PlanSections, arch: Architecture, shard: dict[str, float], megatron: MegatronConfig | None = None
) -> dict[str, float]:
    """A trainer rank's memory by component, from its parameters' bytes (`shard`: rank_bytes's or
    megatron_rank_bytes's, then `megatron` the layout: nothing gathered, activations split by tensor parallel)."""
    b, t = compute_bytes(cfg), cfg.trainer
    root = next(u for u in arch.units(b, t.lora) if not u.is_block)
    tp, sp = (megatron.tensor_parallel, megatron.sequence_parallel) if megatron else (1, False)
    memory = {
        "base shard": shard["base_shard"],
        "gathered": shard.get("gathered", 0.0),
        "root gathered": 0.0 if megatron else root.gathered_bytes(b),
        "trainable": shard["trainable"],
        "optimizer": shard["optimizer"],
        "activations": arch.activation_bytes(t.micro_batch_tokens, b, t.gradient_checkpointing, tp, sp),
        "logits": arch.logits_bytes(t.micro_batch_tokens, b, t.logits_chunk_mb),
    }
    if not cfg.placement.gpus_per_node:  # a CPU rank's memory is its process's
        memory["rank process"] = CPU_RANK_PROCESS_BYTES
    return memory


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """The decoder layers pipeline stage `stage` of `stages` holds (megatron-core's even split)."""
    per_stage = layers // stages
    return range(stage * per_stage, (stage + 1) * per_stage)


def _walk(cfg: PlanSections, arch: Architecture, held: Callable[[Unit, ParamShape], float]) -> dict[str, float]:
    """base_shard, trainable (value and gradient) and optimizer (AdamW's two moments) from the
    elements `held(unit, param)` says the rank holds of each parameter (all `unit.count` alike)."""
    local = {False: 0.0, True: 0.0}  # by trainable
    for unit in arch.units(compute_bytes(cfg), cfg.trainer.lora):
        for param in unit.params:
            local[param.trainable] += held(unit, param) * param.element_bytes
    return {"base_shard": local[False], "trainable": 2 * local[True], "optimizer": 2 * local[True]}
