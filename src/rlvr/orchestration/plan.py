"""Where a run's processes go and how much memory each device needs: `rlvr train CFG --dry-run`.

    plan = make_plan(cfg)          # PlanError (one line) when the placement cannot hold the run
    plan.devices                   # per GPU (or CPU process): what runs there, bytes by component

Placement, as the `placement` section asks (the Ray backend reserves the same shape):
- colocate: the trainer's FSDP2 ranks take GPUs 0..ranks-1, packed node by node; the engine's
  tensor-parallel group shares GPUs 0..TP-1 of node 0 with the first ranks.
- split: the engine gets `engine_gpus` GPUs of its own (= its TP group, on node 0), the
  trainer ranks the GPUs after them.
- no GPUs (gpus_per_node: 0): one process for the controller and the engine, one per rank.

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
- base shard: the frozen base in the trainer's format (NVFP4 stays packed) / FSDP ranks; the
  packed routed experts are sharded by expert, ceil(E / ranks) of them per rank.
- gathered: two decoder blocks unsharded (FSDP2 gathers the block it runs and prefetches the
  next), the largest: an MoE block with all its experts.
- trainable: trainable parameters x 4 (value, gradient, AdamW m and v) / FSDP ranks; LoRA in
  float32 (peft keeps adapters in float32), full fine-tuning at b.
- activations, one micro-batch of T = trainer.micro_batch_tokens tokens, flash attention (no
  T x T matrix). Saved per token and layer: b * (4H + 3Hq + 3Hkv + 4I) (norm inputs and
  outputs, q/k/v before and after RoPE, attention output, MLP gate/up/activation/product);
  for an MoE, I = top_k x expert width + shared width (the experts a token passes through).
  Without gradient checkpointing T * L times that; with it T * L * H * b (block inputs) plus
  one block's worth recomputed. Plus the LM head's chunk: 1024 tokens x V x (b + 12)
  (logits, their float32 copy, softmax temporaries, float32 gradient).
- at load, a rank's device holds its shard and one block in full (fully_shard moves the base
  to the device unit by unit), less than the step's own peak; each rank process reads the
  whole base into host memory first (a note says how much).
Not counted: CUDA context, allocator fragmentation, vLLM's activation workspace and CUDA
graphs (leave some 10 %).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.config import RunConfig

GB = 1e9
GiB = 1 << 30
NVFP4_BITS = 4.5  # 4-bit values + an FP8 (8-bit) scale per group of 16
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LM_HEAD_CHUNK_TOKENS = 1024  # TokenLogprobs' chunk_tokens: the logits exist for this many tokens at a time
OPTIMIZER_COPIES = 4  # value, gradient, AdamW exp_avg and exp_avg_sq
LORA_DTYPE_BYTES = 4  # peft keeps adapter weights in float32 on a bf16 base

class PlanError(ValueError):
    """The placement cannot hold the run; the message is one line naming the keys."""


class NoArchitecture(ValueError):
    """Nothing to estimate memory from: no config.json, no model.estimate, or an unknown layout."""


# --------------------------------------------------------------------- architecture


@dataclass(frozen=True)
class Experts:
    """A fine-grained MoE layer: `count` routed experts of which each token uses `top_k`, plus
    shared experts every token uses, and a router (one logit per expert)."""

    count: int
    top_k: int
    width: int  # one routed expert's hidden width
    shared_width: int  # all shared experts together
    first_dense: int  # leading layers with a dense MLP instead


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3, Mistral Large 3): keys and values come from
    one compressed latent of `kv_rank` values per token, which is all the KV cache stores (plus
    the `rope` shared RoPE key values)."""

    kv_rank: int
    q_rank: int | None
    nope: int
    rope: int
    v_head_dim: int


@dataclass(frozen=True)
class Architecture:
    """A decoder's sizes (biases ignored: < 0.01 % of the weights): dense, MoE, GQA or MLA."""

    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    nvfp4: bool
    source: str
    experts: Experts | None = None
    mla: LatentAttention | None = None

    @property
    def q_width(self) -> int:
        return self.num_heads * (self.mla.nope + self.mla.rope if self.mla else self.head_dim)

    @property
    def kv_width(self) -> int:
        return self.num_heads * (self.mla.nope + self.mla.v_head_dim) if self.mla else self.num_kv_heads * self.head_dim

    def attention_linears(self) -> dict[str, tuple[int, int]]:
        """The attention's Linear layers, (input, output) widths."""
        h, heads = self.hidden, self.num_heads
        if self.mla is None:
            return {"q_proj": (h, self.q_width), "k_proj": (h, self.kv_width), "v_proj": (h, self.kv_width),
                    "o_proj": (self.q_width, h)}
        m = self.mla
        query = {"q_a_proj": (h, m.q_rank), "q_b_proj": (m.q_rank, self.q_width)} if m.q_rank else {"q_proj": (h, self.q_width)}
        return query | {
            "kv_a_proj_with_mqa": (h, m.kv_rank + m.rope),
            "kv_b_proj": (m.kv_rank, heads * (m.nope + m.v_head_dim)),
            "o_proj": (heads * m.v_head_dim, h),
        }

    def mlp_linears(self, width: int) -> dict[str, tuple[int, int]]:
        return {"gate_proj": (self.hidden, width), "up_proj": (self.hidden, width), "down_proj": (width, self.hidden)}

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.experts.first_dense if self.experts else 0

    def _linear_params(self, linears: dict[str, tuple[int, int]]) -> int:
        return sum(a * b for a, b in linears.values())

    @property
    def _attention_linear_params(self) -> int:
        return self._linear_params(self.attention_linears())

    @property
    def _dense_mlp_params(self) -> int:
        return self._linear_params(self.mlp_linears(self.intermediate_size))

    @property
    def _moe_mlp_params(self) -> int:
        """One MoE layer's experts, routed and shared (the router aside)."""
        e = self.experts
        shared = self._linear_params(self.mlp_linears(e.shared_width)) if e.shared_width else 0
        return e.count * 3 * self.hidden * e.width + shared

    @property
    def routed_params(self) -> int:
        """All routed experts' weights, of every MoE layer."""
        e = self.experts
        return self.moe_layers * e.count * 3 * self.hidden * e.width if e else 0

    @property
    def packed_params(self) -> int:
        """The weights an NVFP4 checkpoint packs: every Linear of the decoder blocks, routed and
        shared experts included (routers, norms, embeddings and lm_head stay in float)."""
        moe = self.moe_layers * self._moe_mlp_params if self.moe_layers else 0
        return self.num_layers * self._attention_linear_params + (self.num_layers - self.moe_layers) * self._dense_mlp_params + moe

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden * (1 if self.tie_word_embeddings else 2)

    @property
    def params(self) -> int:
        e = self.experts
        routers = self.moe_layers * e.count * self.hidden if e else 0
        latent_norms = (self.mla.q_rank or 0) + self.mla.kv_rank if self.mla else 0  # MLA's q_a and kv_a norms
        norms = self.num_layers * (2 * self.hidden + latent_norms) + self.hidden
        return self.packed_params + routers + norms + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters used per token: the routed experts count top_k / count of their weights."""
        e = self.experts
        return self.params - (self.routed_params * (e.count - e.top_k) // e.count if e else 0)

    def weight_bytes(self, dtype_bytes: int, nvfp4: bool | None = None) -> float:
        """All weights; the blocks' Linear layers and experts packed when NVFP4 (the default: as stored)."""
        nvfp4 = self.nvfp4 if nvfp4 is None else nvfp4
        return self.packed_params * (NVFP4_BITS / 8 if nvfp4 else dtype_bytes) + (self.params - self.packed_params) * dtype_bytes

    def routed_bytes(self, dtype_bytes: int) -> float:
        return self.routed_params * (NVFP4_BITS / 8 if self.nvfp4 else dtype_bytes)

    def block_bytes(self, dtype_bytes: int) -> float:
        """The largest decoder block (an MoE block with all its experts, when there is one)."""
        per_weight = NVFP4_BITS / 8 if self.nvfp4 else dtype_bytes
        mlp = self._moe_mlp_params if self.moe_layers else self._dense_mlp_params
        return (self._attention_linear_params + mlp) * per_weight + 2 * self.hidden * dtype_bytes

    def lora_params(self, rank: int, targets: list[str] | str, target_experts: bool = False) -> int:
        """LoRA on the named Linears (all-linear: every Linear of the blocks: attention, dense MLPs and
        shared experts); `target_experts` adds a pair per routed expert and projection."""
        def pairs(linears: dict[str, tuple[int, int]]) -> int:
            return sum(rank * (a + b) for name, (a, b) in linears.items() if targets == "all-linear" or name in targets)

        e = self.experts
        dense_layers = self.num_layers - self.moe_layers
        total = self.num_layers * pairs(self.attention_linears()) + dense_layers * pairs(self.mlp_linears(self.intermediate_size))
        if e and e.shared_width:
            total += self.moe_layers * pairs(self.mlp_linears(e.shared_width))
        if e and target_experts:  # gate/up fused (hidden -> 2 x width) and down, per expert
            total += self.moe_layers * e.count * rank * ((self.hidden + 2 * e.width) + (e.width + self.hidden))
        return total

    @property
    def active_mlp_width(self) -> int:
        """The widest MLP a token passes through: the dense one, or top_k routed + shared experts."""
        e = self.experts
        moe = e.top_k * e.width + e.shared_width if e else 0
        return max(moe, self.intermediate_size if self.num_layers > self.moe_layers else 0)

    def activation_bytes(self, tokens: int, dtype_bytes: int, checkpointing: bool) -> float:
        per_token_layer = dtype_bytes * (4 * self.hidden + 3 * self.q_width + 3 * self.kv_width + 4 * self.active_mlp_width)
        if checkpointing:
            blocks = tokens * self.num_layers * self.hidden * dtype_bytes + tokens * per_token_layer
        else:
            blocks = tokens * self.num_layers * per_token_layer
        return blocks + min(tokens, LM_HEAD_CHUNK_TOKENS) * self.vocab_size * (dtype_bytes + 12)

    def kv_bytes_per_token(self, tp: int, dtype_bytes: int) -> float:
        """One token's KV cache on one GPU of a TP group. GQA: keys and values, heads split over TP
        (vLLM replicates KV heads past TP = heads). MLA: the latent and the RoPE key, which every
        head reads, so every GPU of the group holds all of it."""
        if self.mla:
            return self.num_layers * (self.mla.kv_rank + self.mla.rope) * dtype_bytes
        return 2 * self.num_layers * math.ceil(self.num_kv_heads / tp) * self.head_dim * dtype_bytes


def _experts_from_config(text: dict) -> Experts | None:
    """The MoE shape from a config.json's fields, as DeepSeek-V3 / Mistral Large 3, Qwen3-MoE,
    Qwen2-MoE and Mixtral name them."""
    count = text.get("n_routed_experts") or text.get("num_experts") or text.get("num_local_experts")
    if not count:
        return None
    width = text.get("moe_intermediate_size") or text["intermediate_size"]
    shared = (text.get("n_shared_experts") or 0) * width or text.get("shared_expert_intermediate_size") or 0
    return Experts(
        count=count,
        top_k=text["num_experts_per_tok"],
        width=width,
        shared_width=shared,
        first_dense=text.get("first_k_dense_replace") or 0,
    )


def _mla_from_config(text: dict) -> LatentAttention | None:
    if not text.get("kv_lora_rank"):
        return None
    return LatentAttention(kv_rank=text["kv_lora_rank"], q_rank=text.get("q_lora_rank"), nope=text["qk_nope_head_dim"],
                           rope=text["qk_rope_head_dim"], v_head_dim=text["v_head_dim"])


def read_architecture(cfg: RunConfig) -> Architecture:
    """From model.path's config.json when it exists, else from model.estimate."""
    config_path = Path(cfg.model.path) / "config.json"
    if config_path.is_file():
        raw = json.loads(config_path.read_text())
        text = raw.get("text_config") or raw  # multimodal checkpoints keep the decoder's sizes there
        quant = raw.get("quantization_config") or {}
        if quant:
            from rlvr.quant.checkpoint import FORMAT_NAME  # imported only here: it brings torch

            if quant.get("format") != FORMAT_NAME:
                kind = quant.get("format") or quant.get("quant_method")
                raise NoArchitecture(f"{config_path}: quantization {kind!r} is not estimated")
        heads = text["num_attention_heads"]
        return Architecture(
            hidden=text["hidden_size"],
            num_layers=text["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads") or heads,
            head_dim=text.get("head_dim") or text["hidden_size"] // heads,
            intermediate_size=text["intermediate_size"],
            vocab_size=text["vocab_size"],
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            nvfp4=bool(quant),
            source=str(config_path),
            experts=_experts_from_config(text),
            mla=_mla_from_config(text),
        )
    e = cfg.model.estimate
    if e is None:
        raise NoArchitecture(f"no {config_path} and no model.estimate in the config")
    experts = None
    if e.num_experts:
        experts = Experts(count=e.num_experts, top_k=e.num_experts_per_tok, width=e.moe_intermediate_size,
                          shared_width=e.num_shared_experts * e.moe_intermediate_size, first_dense=e.first_dense_layers)
    mla = None
    if e.kv_lora_rank:
        mla = LatentAttention(kv_rank=e.kv_lora_rank, q_rank=e.q_lora_rank, nope=e.qk_nope_head_dim,
                              rope=e.qk_rope_head_dim, v_head_dim=e.v_head_dim)
    return Architecture(
        hidden=e.hidden_size,
        num_layers=e.num_layers,
        num_heads=e.num_heads,
        num_kv_heads=e.num_kv_heads,
        head_dim=e.head_dim or e.hidden_size // e.num_heads,
        intermediate_size=e.intermediate_size,
        vocab_size=e.vocab_size,
        tie_word_embeddings=e.tie_word_embeddings,
        nvfp4=e.weight_format == "nvfp4",
        source="model.estimate",
        experts=experts,
        mla=mla,
    )


# ------------------------------------------------------------------------- the plan


@dataclass
class Device:
    """One GPU (gpu set), or one CPU process (gpu None), and what runs on it."""

    node: int
    gpu: int | None
    engine_rank: int | None = None  # its rank in the engine's TP group; 0 for the CPU engine
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
    fsdp_world: int
    gpus_used: int
    devices: list[Device]
    architecture: Architecture | None
    unknown: str | None  # why there is no memory estimate
    notes: list[str]


def make_plan(cfg: RunConfig) -> Plan:
    """The placement and, when the architecture is known, the memory of every device."""
    p, tp, ranks = cfg.placement, cfg.engine.tensor_parallel_size, cfg.trainer.ranks
    _check_lengths(cfg)
    if p.backend == "local" and p.nodes > 1:
        raise PlanError(f"placement.nodes={p.nodes}: the local backend runs on one machine; use placement.backend: ray")
    devices = _gpu_devices(cfg) if p.gpus_per_node else _cpu_devices(cfg)
    gpus_used = len(devices) if p.gpus_per_node else 0
    notes = []
    if p.gpus_per_node and gpus_used < p.nodes * p.gpus_per_node:
        notes.append(f"{p.nodes * p.gpus_per_node - gpus_used} of {p.nodes * p.gpus_per_node} GPUs left idle")
    try:
        arch = read_architecture(cfg)
    except NoArchitecture as why:
        return Plan(p.backend, p.colocate, p.nodes, p.gpus_per_node, tp, ranks, gpus_used, devices, None, str(why), notes)
    if arch.num_heads % tp:
        raise PlanError(f"engine.tensor_parallel_size={tp} does not divide the model's {arch.num_heads} attention heads")
    _estimate(cfg, arch, devices, notes)
    plan = Plan(p.backend, p.colocate, p.nodes, p.gpus_per_node, tp, ranks, gpus_used, devices, arch, None, notes)
    _check_fit(cfg, plan)
    return plan


def _check_lengths(cfg: RunConfig) -> None:
    longest = cfg.data.max_prompt_tokens + cfg.rollout.sampling.max_tokens
    if cfg.engine.max_model_len < longest:
        raise PlanError(
            f"engine.max_model_len={cfg.engine.max_model_len} < data.max_prompt_tokens + rollout.sampling.max_tokens = {longest}"
        )
    if cfg.trainer.micro_batch_tokens < longest:
        raise PlanError(
            f"trainer.micro_batch_tokens={cfg.trainer.micro_batch_tokens} < the longest sequence "
            f"(data.max_prompt_tokens + rollout.sampling.max_tokens = {longest})"
        )


def _gpu_devices(cfg: RunConfig) -> list[Device]:
    p, tp, ranks = cfg.placement, cfg.engine.tensor_parallel_size, cfg.trainer.ranks
    available = p.nodes * p.gpus_per_node
    if tp > p.gpus_per_node:
        raise PlanError(
            f"engine.tensor_parallel_size={tp} > placement.gpus_per_node={p.gpus_per_node}: a TP group stays on one node"
        )
    if p.colocate:
        needed, first_rank_gpu = max(ranks, tp), 0
        what = f"{ranks} trainer ranks sharing with a TP-{tp} engine"
    else:
        if p.engine_gpus != tp:
            raise PlanError(
                f"placement.engine_gpus={p.engine_gpus} must equal engine.tensor_parallel_size={tp} "
                "(split placement: the engine's GPUs are its TP group)"
            )
        needed, first_rank_gpu = ranks + tp, tp
        what = f"{ranks} trainer ranks + {tp} engine GPUs"
    if needed > available:
        raise PlanError(
            f"placement: {what} need {needed} GPUs; nodes={p.nodes} x gpus_per_node={p.gpus_per_node} has {available}"
        )
    devices = [Device(node=i // p.gpus_per_node, gpu=i % p.gpus_per_node) for i in range(needed)]
    for t in range(tp):
        devices[t].engine_rank = t
    for r in range(ranks):
        devices[first_rank_gpu + r].trainer_rank = r
    return devices


def _cpu_devices(cfg: RunConfig) -> list[Device]:
    return [Device(node=0, gpu=None, engine_rank=0)] + [
        Device(node=0, gpu=None, trainer_rank=r) for r in range(cfg.trainer.ranks)
    ]


def _estimate(cfg: RunConfig, arch: Architecture, devices: list[Device], notes: list[str]) -> None:
    b = DTYPE_BYTES[cfg.model.dtype]
    tp, ranks, lora = cfg.engine.tensor_parallel_size, cfg.trainer.ranks, cfg.trainer.lora
    base = arch.weight_bytes(b)
    if lora is not None:
        lora_params = arch.lora_params(lora.rank, lora.target_modules, lora.target_experts)
        trainable = lora_params * LORA_DTYPE_BYTES * OPTIMIZER_COPIES
        lora_slot = lora_params * b / tp
    else:
        trainable, lora_slot = arch.params * b * OPTIMIZER_COPIES, 0.0
    if cfg.engine.backend == "vllm":
        engine = {"engine weights": base / tp, "KV cache": cfg.engine.kv_cache_gb * GiB, "LoRA slot": lora_slot}
        _note_kv(cfg, arch, notes)
    else:  # transformers generate: float weights, a cache that grows with the batch
        engine = {"engine weights": arch.weight_bytes(b, nvfp4=False)}
        notes.append("engine.backend hf: its KV cache grows with the batch and is not estimated")
    trainer = {
        "base shard": _base_shard(arch, b, ranks),
        "gathered": 2 * arch.block_bytes(b),
        "trainable": trainable / ranks,
        "activations": arch.activation_bytes(cfg.trainer.micro_batch_tokens, b, cfg.trainer.gradient_checkpointing),
    }
    if arch.experts:
        _note_experts(cfg, arch, notes)
    if cfg.placement.gpus_per_node:
        per_node = min(ranks, cfg.placement.gpus_per_node)
        notes.append(f"host memory at load: each trainer process reads the whole base ({base / GB:.1f} GB) before "
                     f"sharding it, {per_node} processes per node")
    for device in devices:
        if device.engine_rank is not None:
            device.memory |= {k: v for k, v in engine.items() if v}
        if device.trainer_rank is not None:
            device.memory |= {k: v for k, v in trainer.items() if v}


def _base_shard(arch: Architecture, dtype_bytes: int, ranks: int) -> float:
    """One rank's share of the frozen base: FSDP2 splits each tensor along its first dimension,
    which for packed experts is the expert: ceil(E / ranks) experts each (the last ranks padded)."""
    routed = arch.routed_bytes(dtype_bytes)
    rest = arch.weight_bytes(dtype_bytes) - routed
    experts_per_rank = math.ceil(arch.experts.count / ranks) / arch.experts.count if arch.experts else 0.0
    return rest / ranks + routed * experts_per_rank


def _note_experts(cfg: RunConfig, arch: Architecture, notes: list[str]) -> None:
    e, tp, ranks = arch.experts, cfg.engine.tensor_parallel_size, cfg.trainer.ranks
    if cfg.engine.backend == "vllm":
        how = (f"expert parallel: {e.count} / {tp} = {e.count / tp:g} whole experts per GPU and layer"
               if cfg.engine.expert_parallel else f"tensor parallel: every expert split {tp} ways (engine.expert_parallel: false)")
        notes.append(f"engine MoE: {how}")
    per_rank = math.ceil(e.count / ranks)
    notes.append(
        f"trainer MoE: FSDP2 shards the packed experts by expert, {per_rank} of {e.count} per rank and layer "
        f"(padded to {per_rank * ranks}); a block's experts are gathered for its forward, and only those that "
        f"received tokens are dequantized"
    )


def _note_kv(cfg: RunConfig, arch: Architecture, notes: list[str]) -> None:
    per_token = arch.kv_bytes_per_token(cfg.engine.tensor_parallel_size, DTYPE_BYTES[cfg.model.dtype])
    tokens = int(cfg.engine.kv_cache_gb * GiB // per_token)
    longest = cfg.data.max_prompt_tokens + cfg.rollout.sampling.max_tokens
    asked = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    notes.append(
        f"KV cache: {cfg.engine.kv_cache_gb:g} GiB per engine GPU holds {tokens:,} tokens = {tokens // longest:,} "
        f"sequences of {longest:,} tokens at once (a step samples {asked:,})"
    )


def _check_fit(cfg: RunConfig, plan: Plan) -> None:
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


# ------------------------------------------------------------------------- printing


def print_plan(plan: Plan, cfg: RunConfig, console) -> None:
    """The plan as a few header lines, a table with a column per group of like devices, and notes."""
    from rich.table import Table

    def say(line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True)

    if plan.gpus_per_node:
        layout = "colocated" if plan.colocate else "split"
        say(f"placement: {plan.backend}, {layout}; {plan.nodes} node(s) x {plan.gpus_per_node} GPUs, {plan.gpus_used} used")
    else:
        say(f"placement: {plan.backend}, CPU only: the engine in the controller process, one process per rank")
    lora = cfg.trainer.lora
    tuned = f"LoRA rank {lora.rank}" if lora else "full fine-tuning"
    say(f"engine: {cfg.engine.backend}, tensor parallel {plan.engine_tp}; trainer: FSDP2 world size {plan.fsdp_world}, {tuned}")
    arch = plan.architecture
    if arch is None:
        say(f"memory: not estimated ({plan.unknown})")
    else:
        b = DTYPE_BYTES[cfg.model.dtype]
        form = "NVFP4 Linear layers" if arch.nvfp4 else cfg.model.dtype
        weights = arch.weight_bytes(b) / GB
        say(f"model: {arch.params / 1e9:.2f}B parameters (from {arch.source}), weights {weights:.2f} GB in {form}")
        if arch.experts:
            e = arch.experts
            say(f"MoE: {arch.active_params / 1e9:.2f}B active per token; {arch.moe_layers} MoE layers of {e.count} routed "
                f"experts (top {e.top_k}) + {e.shared_width // e.width if e.shared_width else 0} shared; routed experts "
                f"{arch.routed_params / 1e9:.2f}B parameters, {arch.routed_bytes(b) / GB:.2f} GB"
                + (" in NVFP4" if arch.nvfp4 else ""))
        if arch.mla:
            say(f"attention: MLA, KV latent {arch.mla.kv_rank} + RoPE key {arch.mla.rope} values per token and layer "
                f"(per-head keys and values would take {arch.num_heads} x {arch.mla.nope + arch.mla.rope + arch.mla.v_head_dim})")
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
    for note in plan.notes:
        say(note)
    if arch is not None:
        largest = max(d.total for d in plan.devices)
        capacity = cfg.placement.gpu_memory_gb
        fit = f"fits placement.gpu_memory_gb={capacity:g}" if capacity and plan.gpus_per_node else "no device capacity checked"
        checkpointing = "on" if cfg.trainer.gradient_checkpointing else "off"
        say(
            f"GB = 1e9 bytes, per device; activations for one micro-batch of {cfg.trainer.micro_batch_tokens:,} tokens "
            f"(gradient checkpointing {checkpointing}); CUDA context and allocator slack not counted. "
            f"Largest device {largest / GB:.1f} GB: {fit}"
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
        previous = groups[-1][-len(run):] if groups else None  # the previous node's run, if as long
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
        parts.append("controller + engine" if group[0].gpu is None else f"engine TP rank {_span([d.engine_rank for d in group])}")
    if group[0].trainer_rank is not None:
        ranks = _span([d.trainer_rank for d in group])
        parts.append(f"trainer rank{'s' if '-' in ranks else ''} {ranks}")
    return " + ".join(parts)
