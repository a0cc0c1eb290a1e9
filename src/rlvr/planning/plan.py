"""Where a run's processes go, how much memory each device and each node needs, and how long
each phase of a step takes at best: `rlvr train CFG --dry-run`.

    plan = make_plan(sections)     # PlanSections.of(cfg); PlanError (one line) when the placement cannot hold the run
    plan.devices                   # per GPU (or CPU process): what runs there, bytes by component
    plan.host                      # per node: host bytes while loading
    plan.step                      # seconds per phase (with placement.gpu; on CPU at measured rates)
    plan.fsdp2_rank                # trainer.backend megatron: what an FSDP2 rank would hold instead

Placement: rlvr.planning.placement's layout (the Ray backend reserves the same), a device per
GPU it uses; with no GPUs (gpus_per_node: 0) one process for the controller and the engines, one
per rank; with placement.engine_cpus the controller and its engine on cores of their own, the
ranks on the others (rlvr.planning.cpu_split).

Memory per device, in bytes (the table prints GB = 1e9 bytes). H hidden, L layers, I MLP
width, Hq/Hkv query/key-value widths (heads x head_dim), V vocabulary, b bytes of model.dtype:
- engine weights: parameters / TP; an NVFP4 checkpoint's Linear layers (attention and MLA
  projections, MLPs, shared and routed experts) at 4.5 bits (4-bit values plus one FP8 scale
  per 16), routers, embeddings, lm_head and norms at b. With engine.expert_parallel the
  routed experts go whole to the TP group's GPUs (E / TP each): the same bytes per GPU.
- KV cache: engine.kv_cache_gb GiB per engine GPU (vLLM's kv_cache_memory_bytes); the note
  says how many tokens it holds: GQA stores 2 x L x Hkv / TP values per token, MLA
  L x (kv_lora_rank + qk_rope_head_dim) on every GPU of the group (the latent serves all heads).
- LoRA slot: the adapter at b / TP (the engine serves one adapter at a time).
- a trainer rank (rlvr.planning.rank_memory, the tensors of rlvr.planning.architecture's `units`):
  base shard: its frozen tensors; trainable: its trainable ones x 2 (value, gradient);
  optimizer: AdamW's exp_avg and exp_avg_sq, 2 x its trainable bytes. FSDP2 (`rank_bytes`)
  holds dim-0 chunks of every tensor over the shard group; gathered: two decoder blocks
  unsharded (the one FSDP2 runs and the one it prefetches; an upper bound, since each packed
  layer is a unit of its own, gathered while it runs), the largest. Shard 0 holds a full chunk
  of every tensor, so every rank shows rank 0's, the worst; FSDP2 pads every rank's parameter
  storage to a full chunk anyway. root gathered: embeddings, final norm and lm_head
  unsharded: FSDP2 does not reshard its root after forward (backward needs it at once).
  Megatron (`megatron_rank_bytes`, trainer.backend megatron) holds its tensor-, expert- and
  pipeline-parallel part whole, each rank its own (pipeline stages differ), nothing gathered;
  the plan also keeps FSDP2's rank 0 (plan.fsdp2_rank) to print beside it.
- activations, one micro-batch of T = trainer.micro_batch_tokens tokens, flash attention (no
  T x T matrix). Saved per token and layer: b * (6H + 3Hq + 3Hkv + 4I) (each RMSNorm's input,
  normalized value and output, q/k/v before and after RoPE, attention output, MLP
  gate/up/activation/product; measured on Qwen2.5-0.5B's blocks, NVFP4 base, LoRA r16, float32
  on CPU: 27.4k values a token and layer, this 27.9k);
  for an MoE, I = top_k x expert width + shared width (the experts a token passes through).
  Without gradient checkpointing T * L times that; with it T * L * H * b (block inputs) plus
  one block's worth recomputed. Megatron's tensor parallel TP divides the 3Hq + 3Hkv + 4I
  part, its sequence parallel the H parts too; pipeline stages change nothing (the first stage
  of a 1F1B schedule holds PP micro-batches of L / PP layers).
- logits: the LM head's working set, one chunk of C = trainer.logits_chunk_mb / (V x (b + 8))
  scored tokens at a time (fewer if the micro-batch scores fewer): C x V x (b + 8), the
  logits and the two float32 copies they are read with (rlvr.training.logits_memory), in
  forward and in backward (which recomputes the chunk's logits).
- rank process (CPU only): a rank's private memory before it builds its policy, the
  interpreter and its libraries; on a GPU that is host memory, not the device's.
Not counted: CUDA context, allocator fragmentation, vLLM's activation workspace and CUDA
graphs (leave some 10 %).

On a CPU-only machine every process holds host memory all the run long: placement.host_memory_gb
is checked against all of the table's processes together. With GPUs it is the host memory of
a node while the run loads, checked against placement.host_memory_gb: the
sum over the processes on the node. A trainer rank loads sharded: it builds the model on the
meta device, shards it, and reads only its own slices from the checkpoint, so it holds at
most its base shard and one decoder block in host memory before they move to its GPU. An
engine worker (one per engine GPU) is counted at its whole share of the weights (weights /
TP): vLLM's loader holds one tensor at a time privately, but the safetensors files it reads
sit in the page cache, and colocated, vLLM's sleep (level 1) keeps those weights in host
memory while the trainer runs.

Time per step: rlvr.planning.step_time (its doc-string has the formulas), on GPUs at
placement.gpu's nominal peaks, on CPU at the rates this machine measured (rlvr.hardware.cpu_rates,
given to make_plan by `--dry-run`). The balance line says who waits: split, with
rollout.max_staleness >= 1 the engine generates step t + 1 while the ranks train step t, so a
step takes max(generate, train + sync) (on CPU: split by placement.engine_cpus); otherwise,
colocated, and on CPU cores the engine and the ranks share, the phases run one after another
and a step takes their sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rlvr.affinity import allowed_cores
from rlvr.engines.replicas import unplaceable
from rlvr.hardware import CpuRates
from rlvr.models.multimodal import encoder_weight_bytes
from rlvr.planning.architecture import (
    GB,
    Architecture,
    GiB,
    NoArchitecture,
    compute_bytes,
    planned_dtype,
    read_architecture,
)
from rlvr.planning.cpu_split import CpuSplit, cpu_split
from rlvr.planning.placement import Layout, PlanError, plan_layout
from rlvr.planning.rank_memory import megatron_misfit, megatron_rank_bytes, rank_bytes, trainer_memory
from rlvr.planning.sections import PlanSections
from rlvr.planning.step_time import StepTime, step_time
from rlvr.rollout.prompts import check_max_model_len, context_length

# ------------------------------------------------------------------------- the plan


@dataclass
class Device:
    """One GPU (gpu set), or one CPU process (gpu None), and what runs on it."""

    node: int
    gpu: int | None
    engine_rank: int | None = None  # its rank in the engine's TP group; 0 for the CPU engine
    engine_replica: int | None = None  # which engine (engine.replicas)
    trainer_rank: int | None = None
    memory: dict[str, float] = field(default_factory=dict)  # bytes by component (empty: unknown)

    @property
    def total(self) -> float:
        return sum(self.memory.values())


@dataclass
class Plan:
    backend: str
    colocate: bool
    nodes: int
    gpus_per_node: int
    engine_tp: int
    engine_replicas: int
    fsdp_world: int
    gpus_used: int
    devices: list[Device]
    architecture: Architecture | None
    unknown: str | None  # why there is no memory estimate
    notes: list[str]
    host: dict[int, float] = field(default_factory=dict)  # node -> host bytes while loading
    step: StepTime | None = None  # with placement.gpu, or on CPU at measured rates
    cores: CpuSplit | None = None  # no GPUs: this machine's cores for the controller and each rank
    trainer_backend: str = "fsdp2"
    fsdp2_rank: dict[str, float] = field(default_factory=dict)  # FSDP2's rank 0 by component, to set beside Megatron's


def make_plan(cfg: PlanSections, cpu_rates: Callable[[int], CpuRates] | None = None) -> Plan:
    """The placement and, when the architecture is known, the memory of every device and node
    and the time of each phase: on a known GPU (placement.gpu), or without GPUs at this CPU's
    rates on so many threads, `cpu_rates(threads)` (rlvr.hardware.cpu_rates; None: not timed)."""
    p, tp, ranks = cfg.placement, cfg.engine.tensor_parallel_size, cfg.trainer.ranks
    _check_lengths(cfg)
    if p.backend == "local" and p.nodes > 1:
        raise PlanError(f"placement.nodes={p.nodes}: the local backend runs on one machine; use placement.backend: ray")
    why = unplaceable(cfg.engine, on_ray=p.backend == "ray")
    if why:
        raise PlanError(why)
    devices = _devices(plan_layout(p, ranks=ranks, engines=cfg.engine.replicas, tp=tp))
    gpus_used = len(devices) if p.gpus_per_node else 0
    notes = []
    if p.gpus_per_node and gpus_used < p.nodes * p.gpus_per_node:
        notes.append(f"{p.nodes * p.gpus_per_node - gpus_used} of {p.nodes * p.gpus_per_node} GPUs left idle")
    try:
        arch, unknown = read_architecture(cfg), None
    except NoArchitecture as missing:
        arch, unknown = None, str(missing)
    host: dict[int, float] = {}
    fsdp2: dict[str, float] = {}
    timed: StepTime | None = None
    if arch is not None:
        if arch.num_heads % tp:
            raise PlanError(
                f"engine.tensor_parallel_size={tp} does not divide the model's {arch.num_heads} attention heads"
            )
        misfit = megatron_misfit(arch, cfg.trainer.megatron) if cfg.trainer.backend == "megatron" else None
        if misfit:
            raise PlanError(misfit)
        host, fsdp2 = _estimate(cfg, arch, devices, notes)
        if p.gpu and p.gpus_per_node:
            timed = step_time(cfg, arch)
        elif not p.gpus_per_node and cpu_rates is not None:
            if planned_dtype(cfg.model, cfg.placement).name in ("float32", "bfloat16"):
                timed = step_time(cfg, arch, cpu_rates)
            else:
                notes.append(
                    f"time per step: not estimated (only float32 and bfloat16 matmuls are measured on CPU, "
                    f"model.dtype is {cfg.model.dtype})"
                )
    plan = Plan(
        backend=p.backend,
        colocate=p.colocate,
        nodes=p.nodes,
        gpus_per_node=p.gpus_per_node,
        engine_tp=tp,
        engine_replicas=cfg.engine.replicas,
        fsdp_world=ranks,
        gpus_used=gpus_used,
        devices=devices,
        architecture=arch,
        unknown=unknown,
        notes=notes,
        host=host,
        step=timed,
        trainer_backend=cfg.trainer.backend,
        fsdp2_rank=fsdp2,
        cores=None if p.gpus_per_node else cpu_split(cfg, allowed_cores()),
    )
    _check_fit(cfg, plan)  # nothing to check without an architecture: no device holds bytes
    _check_host(cfg, plan)
    return plan


def _check_lengths(cfg: PlanSections) -> None:
    """The run's own length rule (rlvr.rollout.prompts.context_length) for a prompt as long as
    data.max_prompt_tokens allows: the engine's max_model_len, and the longest sequence a
    micro-batch must hold. A served model's sequences are its clients', each at most
    engine.max_model_len (none given: as long as the engine makes them)."""

    steps, positions = cfg.steps, cfg.folder.max_positions if cfg.folder is not None else None
    try:
        if steps is None:
            check_max_model_len(cfg.engine.max_model_len, positions, cfg.model.path)
            context = cfg.engine.max_model_len
            longest = f"engine.max_model_len={context}"
        else:
            context = context_length(
                steps.max_prompt_tokens,
                f"a prompt of data.max_prompt_tokens={steps.max_prompt_tokens}",
                max_tokens=steps.rollout.sampling.max_tokens,
                env=steps.env,
                max_model_len=cfg.engine.max_model_len,
                positions=positions,
                model=cfg.model.path,
            )
            longest = (
                f"the engine's max_model_len {context} for a prompt of data.max_prompt_tokens={steps.max_prompt_tokens}"
            )
    except ValueError as why:
        raise PlanError(str(why)) from None
    if context is not None and cfg.trainer.micro_batch_tokens < context:
        raise PlanError(
            f"trainer.micro_batch_tokens={cfg.trainer.micro_batch_tokens} < the longest sequence ({longest})"
        )


def _devices(layout: Layout) -> list[Device]:
    """With GPUs one per GPU the layout uses, in node and GPU order (a colocated engine and trainer
    rank on one); without, one per process, the engines (in the controller) first."""
    if not layout.gpus_per_node:
        return [
            Device(node=slot.node, gpu=None, engine_rank=0, engine_replica=slot.index)
            if slot.role == "engine"
            else Device(node=slot.node, gpu=None, trainer_rank=slot.index)
            for slot in layout.slots
        ]
    devices: dict[tuple[int, int], Device] = {}
    for slot in layout.slots:
        for tp_rank, gpu in enumerate(slot.gpus):
            device = devices.setdefault((slot.node, gpu), Device(node=slot.node, gpu=gpu))
            if slot.role == "engine":
                device.engine_replica, device.engine_rank = slot.index, tp_rank
            else:
                device.trainer_rank = slot.index
    return [devices[place] for place in sorted(devices)]


def _estimate(
    cfg: PlanSections, arch: Architecture, devices: list[Device], notes: list[str]
) -> tuple[dict[int, float], dict[str, float]]:
    """Fill each device's memory; return each node's host bytes while loading (GPU placements) and
    what an FSDP2 rank would hold (the trainer's memory beside Megatron's)."""
    b = compute_bytes(cfg)
    tp, lora = cfg.engine.tensor_parallel_size, cfg.trainer.lora
    base = arch.weight_bytes(b)
    lora_slot = arch.adapter_params(lora) * b / tp if lora else 0.0
    if cfg.engine.backend == "vllm":
        engine = {"engine weights": base / tp, "KV cache": cfg.engine.kv_cache_gb * GiB, "LoRA slot": lora_slot}
        _note_kv(cfg, arch, notes)
    else:  # transformers generate: float weights, a cache that grows with the batch
        engine = {"engine weights": arch.weight_bytes(b, nvfp4=False)}
        notes.append("engine.backend hf: its KV cache grows with the batch and is not estimated")
    _note_encoders(cfg, notes)
    fsdp2 = trainer_memory(cfg, arch, rank_bytes(cfg, 0, arch))  # shard 0 holds the most (see the module doc-string)
    trainer = [fsdp2] * cfg.trainer.ranks
    if cfg.trainer.backend == "megatron":
        layout = cfg.trainer.megatron
        trainer = [trainer_memory(cfg, arch, megatron_rank_bytes(cfg, r, arch), layout) for r in range(len(trainer))]
        _note_megatron(cfg, arch, notes)
    elif arch.experts:
        _note_experts(cfg, arch, notes)
    host: dict[int, float] = {}
    for device in devices:
        rank = trainer[device.trainer_rank] if device.trainer_rank is not None else {}
        if device.engine_rank is not None:
            device.memory |= {k: v for k, v in engine.items() if v}
        device.memory |= {k: v for k, v in rank.items() if v}
        if cfg.placement.gpus_per_node:
            loading = (engine["engine weights"] if device.engine_rank is not None else 0.0) + (
                rank["base shard"] + arch.block_bytes(b) if rank else 0.0
            )
            host[device.node] = host.get(device.node, 0.0) + loading
    return host, fsdp2


def _note_megatron(cfg: PlanSections, arch: Architecture, notes: list[str]) -> None:
    m, ranks = cfg.trainer.megatron, cfg.trainer.ranks
    if arch.experts:
        notes.append(
            f"trainer MoE: Megatron's expert parallel {m.expert_parallel}: {arch.experts.count // m.expert_parallel} of "
            f"{arch.experts.count} routed experts per rank and layer, each split {m.tensor_parallel} ways by tensor "
            f"parallel; held whole, never gathered"
        )
    if m.pipeline_parallel > 1:
        notes.append(
            f"pipeline: {m.pipeline_parallel} stages of {arch.num_layers // m.pipeline_parallel} layers (ranks "
            f"{ranks // m.pipeline_parallel} apart); activations counted for all {arch.num_layers} layers, as the first "
            f"stage of a 1F1B schedule holds {m.pipeline_parallel} micro-batches in flight"
        )
    latent = [what for what, there in (("MLA", arch.mla), ("MoE", arch.experts)) if there]
    if latent and m.tensor_parallel > 1:
        notes.append(
            f"trainer.backend megatron: its rank splits an {' + '.join(latent)} model by expert parallel alone "
            f"(tensor_parallel 1); this is the layout megatron-core would hold"
        )
    if arch.nvfp4:
        notes.append(
            "trainer.backend megatron: the 4-bit base counted dequantized to the compute dtype, as its rank reads it"
        )
    if cfg.trainer.gradient_checkpointing:
        notes.append(
            "gradient checkpointing counted as megatron-core's full recompute, which the Megatron rank does not set yet"
        )


def _note_experts(cfg: PlanSections, arch: Architecture, notes: list[str]) -> None:
    e, tp = arch.experts, cfg.engine.tensor_parallel_size
    shards = cfg.trainer.shard_ranks or cfg.trainer.ranks
    if cfg.engine.backend == "vllm":
        how = (
            f"expert parallel: {e.count} / {tp} = {e.count / tp:g} whole experts per GPU and layer"
            if cfg.engine.expert_parallel
            else f"tensor parallel: every expert split {tp} ways (engine.expert_parallel: false)"
        )
        notes.append(f"engine MoE: {how}")
    per_rank = math.ceil(e.count / shards)
    holders = math.ceil(e.count / per_rank)
    notes.append(
        f"trainer MoE: FSDP2 shards the packed experts by expert over {shards} ranks, {per_rank} of {e.count} per rank and "
        f"layer (shards 0-{holders - 1} hold them; storage padded to {per_rank} on every rank); a block's experts are "
        f"gathered for its forward, and only those that received tokens are dequantized"
    )


def _note_encoders(cfg: PlanSections, notes: list[str]) -> None:
    """A multimodal checkpoint runs text-only: its encoders are loaded by neither side, so counted on neither."""

    found = cfg.folder.modalities if cfg.folder is not None else ()
    if found:
        tensors, size = encoder_weight_bytes(cfg.model.path)
        notes.append(
            f"multimodal checkpoint ({', '.join(found)}), run text-only: the trainer builds the language model "
            f"alone and the engine gets limit_mm_per_prompt 0, with which vLLM builds no encoder; its "
            f"{tensors} encoder tensors ({size / GB:.2f} GB) are counted on neither"
        )


def _note_kv(cfg: PlanSections, arch: Architecture, notes: list[str]) -> None:
    per_token = arch.kv_bytes_per_token(cfg.engine.tensor_parallel_size, compute_bytes(cfg))
    tokens = int(cfg.engine.kv_cache_gb * GiB // per_token)
    held = f"KV cache: {cfg.engine.kv_cache_gb:g} GiB per engine GPU holds {tokens:,} tokens"
    steps = cfg.steps
    if steps is None:  # a served model: its clients' sequences are theirs
        notes.append(held)
        return
    longest = steps.max_prompt_tokens + steps.rollout.sampling.max_tokens
    asked, replicas = steps.rollout.prompts_per_step * steps.rollout.samples_per_prompt, cfg.engine.replicas
    each = f", {math.ceil(asked / replicas):,} per engine at most" if replicas > 1 else ""
    notes.append(
        f"{held} = {tokens // longest:,} sequences of {longest:,} tokens at once (a step samples {asked:,}{each})"
    )


def _check_fit(cfg: PlanSections, plan: Plan) -> None:
    capacity = cfg.placement.gpu_memory_gb
    if capacity is None or not cfg.placement.gpus_per_node:
        return
    worst = max(plan.devices, key=lambda d: d.total)
    need = worst.total
    if need > capacity * GB:
        top = sorted(worst.memory.items(), key=lambda kv: -kv[1])[:3]
        parts = ", ".join(f"{name} {value / GB:.1f}" for name, value in top)
        raise PlanError(
            f"node {worst.node} GPU {worst.gpu} needs ~{need / GB:.1f} GB ({parts}), "
            f"over placement.gpu_memory_gb={capacity:g}"
        )


def _check_host(cfg: PlanSections, plan: Plan) -> None:
    capacity = cfg.placement.host_memory_gb
    if capacity is None:
        return
    if not cfg.placement.gpus_per_node:  # CPU only: every process of the run holds host memory, all the run long
        need, parts = all_devices_bytes(plan)
        if need > capacity * GB:
            raise PlanError(
                f"the run's processes on this machine need ~{need / GB:.1f} GB ({parts}), "
                f"over placement.host_memory_gb={capacity:g}"
            )
        return
    if not plan.host:
        return
    node, need = max(plan.host.items(), key=lambda kv: kv[1])
    if need > capacity * GB:
        raise PlanError(
            f"node {node} needs ~{need / GB:.1f} GB of host memory while loading ({host_parts(plan, node)}), "
            f"over placement.host_memory_gb={capacity:g}"
        )


def all_devices_bytes(plan: Plan) -> tuple[float, str]:
    """What the plan's devices hold together (on a CPU-only machine: all the run's processes, the
    controller with its engines and the ranks), and its three largest parts in words."""
    parts: dict[str, float] = {}
    for device in plan.devices:
        for name, size in device.memory.items():
            parts[name] = parts.get(name, 0.0) + size
    largest = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    return sum(parts.values()), ", ".join(f"{name} {size / GB:.2f}" for name, size in largest)


def adapter_bytes(plan: Plan) -> float:
    """What one LoRA adapter's own tensors take on the plan's devices: its weights, gradient and
    AdamW moments on the trainer ranks, its slot on the engines. A second adapter trained and
    served on the same base (rlvr serve's shared hosts) adds this, not the base again."""
    own = ("trainable", "optimizer", "LoRA slot")
    return sum(device.memory.get(name, 0.0) for device in plan.devices for name in own)


def host_parts(plan: Plan, node: int) -> str:
    on_node = [d for d in plan.devices if d.node == node]
    engines = sum(d.engine_rank is not None for d in on_node)
    ranks = sum(d.trainer_rank is not None for d in on_node)
    parts = [f"{engines} engine worker{'s' * (engines != 1)}"] if engines else []
    return ", ".join(parts + ([f"{ranks} trainer rank{'s' * (ranks != 1)}"] if ranks else []))


# ------------------------------------------------------------------------- printing
