"""`--dry-run`'s plan in the terminal: each device kind with what it holds, the host's memory,
and the time a step takes at the measured or nominal rates (rlvr.planning.plan computes it)."""

from __future__ import annotations

from dataclasses import replace

from rlvr.hardware import cpu_rates_cache
from rlvr.planning.architecture import GB, compute_bytes, planned_dtype
from rlvr.planning.plan import Device, Plan, all_devices_bytes, host_parts
from rlvr.planning.sections import PlanSections, StepShape
from rlvr.planning.step_time import step_time
from rlvr.training.logits_memory import chunk_tokens


def print_plan(plan: Plan, cfg: PlanSections, console) -> None:
    """The plan as a few header lines, a table with a column per group of like devices, and notes."""
    from rich.table import Table

    def say(line: str) -> None:
        console.print(line, highlight=False)

    if plan.gpus_per_node:
        layout = "colocated" if plan.colocate else "split"
        say(
            f"placement: {plan.backend}, {layout}; {plan.nodes} node(s) x {plan.gpus_per_node} GPUs, {plan.gpus_used} used"
        )
    else:
        say(f"placement: {plan.backend}, CPU only: the engine in the controller process, one process per rank")
        say(plan.cores.describe())
        if plan.cores.warning:
            say(f"warning: {plan.cores.warning}")
    lora = cfg.trainer.lora
    tuned = f"LoRA rank {lora.rank}" if lora else "full fine-tuning"
    shards = cfg.trainer.shard_ranks or plan.fsdp_world
    mesh = f"HSDP, {plan.fsdp_world // shards} replicas x {shards} shards" if shards < plan.fsdp_world else "FSDP2"
    if plan.trainer_backend == "megatron":
        m = cfg.trainer.megatron
        replicas = plan.fsdp_world // (m.tensor_parallel * m.pipeline_parallel)
        mesh = (
            f"Megatron: tensor parallel {m.tensor_parallel}, expert parallel {m.expert_parallel}, pipeline "
            f"{m.pipeline_parallel}{', sequence parallel' * m.sequence_parallel}, {replicas} data-parallel replica{'s' * (replicas > 1)}"
        )
    engines = f"{plan.engine_replicas} replicas x " if plan.engine_replicas > 1 else ""
    say(
        f"engine: {cfg.engine.backend}, {engines}tensor parallel {plan.engine_tp}; trainer: world size {plan.fsdp_world} ({mesh}), {tuned}"
    )
    arch = plan.architecture
    if arch is None:
        say(f"memory: not estimated ({plan.unknown})")
    else:
        b = compute_bytes(cfg)
        form = "NVFP4 Linear layers" if arch.nvfp4 else planned_dtype(cfg.model, cfg.placement).name
        weights = arch.weight_bytes(b) / GB
        say(f"model: {arch.params / 1e9:.2f}B parameters (from {arch.source}), weights {weights:.2f} GB in {form}")
        if arch.experts:
            e = arch.experts
            say(
                f"MoE: {arch.active_params / 1e9:.2f}B active per token; {arch.moe_layers} MoE layers of {e.count} routed "
                f"experts (top {e.top_k}) + {e.shared_width // e.width if e.shared_width else 0} shared; routed experts "
                f"{arch.routed_params / 1e9:.2f}B parameters, {arch.routed_bytes(b) / GB:.2f} GB"
                + (" in NVFP4" if arch.nvfp4 else "")
            )
        if arch.mla:
            say(
                f"attention: MLA, KV latent {arch.mla.kv_rank} + RoPE key {arch.mla.rope} values per token and layer "
                f"(per-head keys and values would take {arch.num_heads} x {arch.mla.nope + arch.mla.rope + arch.mla.v_head_dim})"
            )
    groups = _groups(plan.devices)
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("GB per device")
    for group in groups:
        table.add_column(f"{_where(group)}\n{_runs(group)}", justify="right")
    components = list(dict.fromkeys(name for d in plan.devices for name in d.memory))
    for name in components:
        table.add_row(name, *(_gb(g[0].memory.get(name)) for g in groups))
    if components:
        table.add_row("total", *(_gb(g[0].total) for g in groups), style="bold")
    console.print(table)
    if plan.trainer_backend == "megatron" and plan.fsdp2_rank:
        parts = ", ".join(f"{name} {size / GB:.2f}" for name, size in plan.fsdp2_rank.items() if size)
        say(
            f"FSDP2 instead (trainer.backend=fsdp2, sharded over all {plan.fsdp_world} ranks): each trainer rank "
            f"{sum(plan.fsdp2_rank.values()) / GB:.2f} GB ({parts})"
        )
    for note in plan.notes:
        say(note)
    if arch is not None:
        largest = max(d.total for d in plan.devices)
        checkpointing = "on" if cfg.trainer.gradient_checkpointing else "off"
        if plan.gpus_per_node:
            capacity = cfg.placement.gpu_memory_gb
            fit = f"Largest device {largest / GB:.1f} GB: " + (
                f"fits placement.gpu_memory_gb={capacity:g}" if capacity else "no device capacity checked"
            )
            unseen = "CUDA context and allocator slack not counted"
        else:
            capacity, (together, _) = cfg.placement.host_memory_gb, all_devices_bytes(plan)
            fit = f"All processes {together / GB:.1f} GB: " + (
                f"fits placement.host_memory_gb={capacity:g}"
                if capacity
                else "placement.host_memory_gb not set: not checked"
            )
            unseen = "the controller's and the engine's own process not counted"
        chunk = chunk_tokens(
            cfg.trainer.logits_chunk_mb * 1e6, arch.vocab_size, compute_bytes(cfg), arch.softcapped_logits
        )
        say(
            f"GB = 1e9 bytes, per device; activations for one micro-batch of {cfg.trainer.micro_batch_tokens:,} tokens "
            f"(gradient checkpointing {checkpointing}), logits for {chunk:,} scored tokens at a time "
            f"(trainer.logits_chunk_mb); {unseen}. {fit}"
        )
    if plan.host:
        runs: list[list[int]] = []  # successive nodes alike
        for node in sorted(plan.host):
            alike = runs and (plan.host[runs[-1][-1]], host_parts(plan, runs[-1][-1])) == (
                plan.host[node],
                host_parts(plan, node),
            )
            runs[-1].append(node) if alike else runs.append([node])
        per_node = ", ".join(
            f"node{'s' * (len(r) > 1)} {_span(r)}: {plan.host[r[0]] / GB:.1f} ({host_parts(plan, r[0])})" for r in runs
        )
        capacity = cfg.placement.host_memory_gb
        fit = (
            f"fits placement.host_memory_gb={capacity:g}"
            if capacity
            else "placement.host_memory_gb not set: not checked"
        )
        say(
            f"host memory while loading, GB per node (each rank reads only its shard; an engine worker its weights): "
            f"{per_node}; {fit}"
        )
    if plan.step and cfg.steps is not None:  # timed: a run's own steps
        _print_step(plan, cfg, cfg.steps, say)


def _print_step(plan: Plan, cfg: PlanSections, steps: StepShape, say) -> None:
    t = plan.step
    longest = steps.max_prompt_tokens + steps.rollout.sampling.max_tokens
    if t.engine_device.cpu:
        _print_cpu_step(plan, cfg, steps, longest, say)
        return
    say(
        f"time per step at {cfg.placement.gpu.upper()} nominal peaks, every sample {longest:,} tokens long (an upper "
        f"bound; rlvr.planning.step_time): generate {t.generate:,.0f} s ({t.engines} engine{'s' * (t.engines > 1)} of "
        f"TP {plan.engine_tp}: {t.decoded_at_once} sequences at once{' each' * (t.engines > 1)}, {t.waves} waves), train {t.train:,.0f} s (compute {t.train_compute:,.0f} s, "
        f"FSDP2 communication {t.train_communication:,.0f} s), sync {t.sync:.1f} s"
        + (
            " (trainer.backend megatron: its tensor- and expert-parallel collectives are not timed; FSDP2's stand in)"
            if plan.trainer_backend == "megatron"
            else ""
        )
    )
    busy = t.train + t.sync
    ratio = t.generate / busy
    if plan.colocate or not steps.rollout.max_staleness:
        layout = "colocated" if plan.colocate else "split without rollout.max_staleness"
        idle = plan.gpus_used - plan.engine_tp * plan.engine_replicas
        say(
            f"balance: {layout}, the phases take turns: a step takes ~{t.generate + busy:,.0f} s"
            + (f"; {idle} GPUs outside the engines idle while they generate ({t.generate:,.0f} s)" if idle else "")
        )
        return
    if ratio >= 1:
        say(
            f"balance: split, generating one step ahead: a step takes ~{t.generate:,.0f} s; the trainer waits "
            f"{t.generate - busy:,.0f} s of it for rollouts (idle {1 - 1 / ratio:.0%})" + _moved(plan, cfg, +1)
        )
    else:
        say(
            f"balance: split, generating one step ahead: a step takes ~{busy:,.0f} s; the engines wait "
            f"{busy - t.generate:,.0f} s of it for the trainer (idle {1 - ratio:.0%})" + _moved(plan, cfg, -1)
        )


def _print_cpu_step(plan: Plan, cfg: PlanSections, steps: StepShape, longest: int, say) -> None:
    t, dtype = plan.step, planned_dtype(cfg.model, cfg.placement).name
    engines = f"{t.engines} engines" if t.engines > 1 else "the engine"
    say(
        f"time per step at this CPU's measured peaks, every sample {longest:,} tokens long (the bound: a run takes longer; "
        f"rlvr.planning.step_time): generate {t.generate:.2f} s ({engines} on {t.engine_threads} thread"
        f"{'s' * (t.engine_threads > 1)} at {t.engine_device.matmul_flops / 1e9:,.0f} GFLOP/s {dtype} and "
        f"{t.engine_device.memory_bytes_per_s / 1e9:.1f} GB/s: {t.decoded_at_once} sequences at once, {t.waves} "
        f"wave{'s' * (t.waves > 1)}), train {t.train:.2f} s ({cfg.trainer.ranks} rank{'s' * (cfg.trainer.ranks > 1)} "
        f"on {t.trainer_threads} thread{'s' * (t.trainer_threads > 1)} at {t.trainer_device.matmul_flops / 1e9:,.0f} "
        f"GFLOP/s: compute {t.train_compute:.2f} s, gloo {t.train_communication:.2f} s), sync {t.sync:.2f} s"
    )
    cached = f"rates measured once, cached in {cpu_rates_cache()}: delete it to measure again"
    busy = t.train + t.sync
    if plan.cores.split and steps.rollout.max_staleness:
        waiting = (
            f"the ranks wait {t.generate - busy:.2f} s of it for rollouts"
            if t.generate >= busy
            else f"the engine waits {busy - t.generate:.2f} s of it for the ranks"
        )
        say(
            f"balance: split cores (placement.engine_cpus), generating one step ahead: a step takes "
            f"~{max(t.generate, busy):.2f} s; {waiting} ({cached})"
        )
        return
    why = (
        "split cores without rollout.max_staleness" if plan.cores.split else "the engine and the ranks share the cores"
    )
    say(f"balance: {why}, so the phases take turns: a step takes ~{t.generate + busy:.2f} s ({cached})")


def _moved(plan: Plan, cfg: PlanSections, engines: int) -> str:
    """What the step would take with `engines` engines more (+1) or fewer (-1), their GPUs taken
    from or given to the trainer ranks (a split run generating ahead); empty where impossible."""
    replicas, ranks = plan.engine_replicas + engines, plan.fsdp_world - engines * plan.engine_tp
    m = cfg.trainer.megatron
    layout = m.tensor_parallel * m.expert_parallel * m.pipeline_parallel if plan.trainer_backend == "megatron" else 1
    if replicas < 1 or ranks < (cfg.trainer.shard_ranks or 1) or ranks % layout:
        return ""
    moved = replace(
        cfg,
        engine=cfg.engine.model_copy(update={"replicas": replicas}),
        trainer=cfg.trainer.model_copy(update={"ranks": ranks}),
    )
    t = step_time(moved, plan.architecture)
    step = max(t.generate, t.train + t.sync)
    return (
        f"; with engine.replicas={replicas} and trainer.ranks={ranks} (placement.engine_gpus="
        f"{replicas * plan.engine_tp}) a step would take ~{step:,.0f} s"
    )


def _gb(value: float | None) -> str:
    return "" if not value else f"{value / GB:.2f}"


def _signature(d: Device) -> tuple:
    return (d.engine_rank is not None, d.trainer_rank is not None, tuple(sorted(d.memory.items())))


def _groups(devices: list[Device]) -> list[list[Device]]:
    """Consecutive like devices: runs within a node, then equal runs of successive nodes merged."""
    runs: list[list[Device]] = []
    for d in devices:
        last = runs[-1][-1] if runs else None
        if last is not None and last.node == d.node and _signature(last) == _signature(d):
            runs[-1].append(d)
        else:
            runs.append([d])
    groups: list[list[Device]] = []
    for run in runs:
        previous = groups[-1][-len(run) :] if groups else None  # the previous node's run, if as long
        if previous and previous[-1].node + 1 == run[0].node and _run_shape(previous) == _run_shape(run):
            groups[-1].extend(run)
        else:
            groups.append(run)
    return groups


def _run_shape(run: list[Device]) -> tuple:
    return run[0].node == run[-1].node, run[0].gpu, run[-1].gpu, _signature(run[0])


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def _where(group: list[Device]) -> str:
    if group[0].gpu is None:
        return "CPU process"
    nodes = _span([d.node for d in group])
    return f"node{'s' if '-' in nodes else ''} {nodes}, GPU {_span([d.gpu for d in group])}"


def _runs(group: list[Device]) -> str:
    parts = []
    if group[0].engine_rank is not None:
        replicas = _span([d.engine_replica for d in group])
        engines = f"engines {replicas}" if "-" in replicas else "engine" if replicas == "0" else f"engine {replicas}"
        parts.append(
            f"controller + {engines}"
            if group[0].gpu is None
            else f"{engines}{',' * (engines != 'engine')} TP rank {_span([d.engine_rank for d in group])}"
        )
    if group[0].trainer_rank is not None:
        ranks = _span([d.trainer_rank for d in group])
        parts.append(f"trainer rank{'s' if '-' in ranks else ''} {ranks}")
    return " + ".join(parts)
