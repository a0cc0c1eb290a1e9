"""Seconds per RL step in each phase (generate, train, sync), from FLOPs and bytes at the GPU's
nominal peaks (rlvr.orchestration.accelerators), for `rlvr train CFG --dry-run`.

What a layout allows at best (100% of every peak, communication hidden behind compute where
it can be): compare layouts by it, do not expect a run to reach it. It times the longest step
the config allows, every sample running to rollout.sampling.max_tokens (Lr) after a prompt of
data.max_prompt_tokens (Lp): S = prompts_per_step x samples_per_prompt sequences of
L = Lp + Lr tokens. N is the parameters a token multiplies (the active parameters less an
untied input embedding, a lookup), peak the GPU's dense BF16 FLOP/s, HBM its bandwidth.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlvr.config import RunConfig
from rlvr.orchestration.accelerators import ACCELERATORS, Accelerator
from rlvr.orchestration.architecture import GiB, LORA_DTYPE_BYTES, Architecture, compute_bytes


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


def step_time(cfg: RunConfig, arch: Architecture) -> StepTime:
    """The phases of the config's longest step on `placement.gpu` (set), with `engine.replicas` engines."""
    engines = cfg.engine.replicas
    gpu = ACCELERATORS[cfg.placement.gpu]
    b = compute_bytes(cfg)
    prompt, response = cfg.data.max_prompt_tokens, cfg.rollout.sampling.max_tokens
    sequences = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    multiplied = arch.active_params - (0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden)
    generate, at_once, waves = _generate(cfg, arch, gpu, b, multiplied, prompt, response, math.ceil(sequences / engines))
    compute, communication = _train(cfg, arch, gpu, b, multiplied, sequences, prompt + response)
    return StepTime(generate, max(compute, communication), _sync(cfg, arch, gpu, b, engines), at_once, waves, compute,
                    communication, engines)


def _generate(cfg: RunConfig, arch: Architecture, gpu: Accelerator, b: int, multiplied: int, prompt: int, response: int,
              sequences: int) -> tuple[float, int, int]:
    tp = cfg.engine.tensor_parallel_size
    kv_per_token = arch.kv_bytes_per_token(tp, b)
    fit = int(cfg.engine.kv_cache_gb * GiB // (kv_per_token * (prompt + response)))
    at_once = max(1, min(sequences, fit, cfg.engine.max_num_seqs or gpu.vllm_max_num_seqs))
    waves = math.ceil(sequences / at_once)
    routed = arch.routed_bytes(b)
    reached = 1 - (1 - arch.experts.top_k / arch.experts.count) ** at_once if arch.experts else 1.0
    weights = (arch.weight_bytes(b) - routed + routed * reached) / tp
    context = prompt + response / 2
    kv = at_once * context * kv_per_token
    if arch.mla:
        attention = 2 * arch.num_heads * (2 * arch.mla.kv_rank + arch.mla.rope)
    else:
        attention = 4 * arch.num_heads * arch.head_dim
    flops = 2 * multiplied * at_once + attention * arch.num_layers * context * at_once
    decode_step = max((weights + kv) / gpu.hbm_bytes_per_s, flops / (tp * gpu.bf16_flops))
    prefill = 2 * multiplied * cfg.rollout.prompts_per_step * prompt / (tp * gpu.bf16_flops)
    return prefill + waves * response * decode_step, at_once, waves


def _train(cfg: RunConfig, arch: Architecture, gpu: Accelerator, b: int, multiplied: int, sequences: int,
           length: int) -> tuple[float, float]:
    t, p = cfg.trainer, cfg.placement
    update = 2 + t.gradient_checkpointing + (t.lora is None)  # forward, recomputation, backward (x2 full)
    attention_update = 1 + t.gradient_checkpointing + 2
    # pi_old's forward and the one after the updates (approx_kl) only where a step makes several
    # updates (with one, pi_old is the policy itself); the reference forward when KL is on
    several = t.mini_batches * t.epochs > 1
    extra_forwards = 2 * several + (cfg.algorithm.kl_coef > 0)
    linear = 2 * multiplied * sequences * length * (update * t.epochs + extra_forwards)
    qk, v = (arch.mla.nope + arch.mla.rope, arch.mla.v_head_dim) if arch.mla else (arch.head_dim, arch.head_dim)
    per_layer = 2 * arch.num_heads * (qk + v) * length**2 / 2
    attention = per_layer * arch.num_layers * sequences * (attention_update * t.epochs + extra_forwards)
    compute = (linear + attention) / (t.ranks * gpu.bf16_flops)

    shards = t.shard_ranks or t.ranks
    micro_batches = math.ceil(sequences * length / t.ranks / t.micro_batch_tokens)
    units = arch.units(b, t.lora)
    gathered = sum(u.count * u.gathered_bytes(b) for u in units)
    gradients = sum(u.count * param.numel * 4 for u in units for param in u.params if param.trainable)  # reduce_dtype float32
    gathers = 2 * t.epochs + extra_forwards
    moved = micro_batches * (gathers * gathered + t.epochs * gradients) * (shards - 1) / shards
    in_node = shards <= p.gpus_per_node
    communication = moved / (gpu.nvlink_bytes_per_s if in_node else gpu.network_bytes_per_s)
    return compute, communication


def _sync(cfg: RunConfig, arch: Architecture, gpu: Accelerator, b: int, engines: int) -> float:
    lora = cfg.trainer.lora
    pushed = engines * (arch.adapter_params(lora) * LORA_DTYPE_BYTES if lora else arch.params * b)
    switch = 2 * arch.weight_bytes(b) / cfg.engine.tensor_parallel_size / gpu.host_bytes_per_s if cfg.placement.colocate else 0.0
    return pushed / gpu.network_bytes_per_s + switch
