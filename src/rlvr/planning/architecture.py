"""A decoder's sizes (dense or MoE, GQA or MLA, float or NVFP4), read from a checkpoint's
config.json or the config's `model.estimate`, and its parameters as the trainer holds them.

    arch = read_architecture(cfg)
    arch.params, arch.active_params, arch.weight_bytes(dtype_bytes)
    arch.units(dtype_bytes, cfg.trainer.lora)   # every parameter: dim-0 rows, bytes per row, trainable

`units` lists the tensors the trainer's module tree holds, grouped as FSDP2 wraps them (a
dense block, an MoE block, the root), each as the rows FSDP2 splits (dim 0) and the bytes of
one row, so a rank's share follows torch.chunk's rule exactly (rlvr.planning.rank_memory), and
each tagged with how Megatron's layout splits it (rlvr.planning.params):
- an NVFP4 Linear (rlvr.quant.linear) stores `weight_packed` uint8 [out, in/2] and
  `weight_scale` FP8 [out, in/16]: out rows of in x 9/16 bytes (the two tensors have the same
  rows, so they shard alike); its global scales are one-float buffers, replicated, not listed;
- packed routed experts (rlvr.quant.experts) store gate and up fused as transformers'
  DeepseekV3Experts does, `[E, 2 x width, hidden]` packed the same way, and down `[E, hidden,
  width]`: E rows each (their [E, parts] global scales are buffers, not listed);
- float tensors at the model's dtype: embeddings, an untied lm_head, norms (the block's two,
  MLA's q_a and kv_a norms), the router's gate `[E, hidden]`; DeepSeek's
  `e_score_correction_bias` is a float32 buffer (`_keep_in_fp32_modules_strict`), not listed;
- LoRA (peft keeps it in float32): `lora_A` [rank, in] and `lora_B` [out, rank] on every
  targeted Linear, packed or not ("all-linear": every Linear of the blocks, as
  rlvr.quant.prepare_lora_config resolves it: attention and MLA projections, dense MLPs,
  shared experts; not the router, which is no Linear, nor lm_head; on MLA not kv_b_proj,
  which vLLM's decode bypasses: rlvr.engines.lora_targets); with
  `lora.target_experts` peft's `target_parameters` pairs per projection, `lora_A` [rank x E,
  in] and `lora_B` [out, rank x E], at the model's dtype (rlvr.quant.experts adds them after
  peft's float32 cast).
Full fine-tuning trains every tensor at the model's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlvr.config import LoraConfig, ModelConfig, PlacementConfig
from rlvr.engines.lora_targets import engine_lora_targets
from rlvr.hardware import ComputeDtype, compute_dtype, local_device
from rlvr.planning.params import LINEAR_SPLIT, ParamShape, Unit
from rlvr.planning.sections import PlanSections
from rlvr.quant.formats import FORMAT_NAME
from rlvr.training.logits_memory import working_bytes

GB = 1e9
GiB = 1 << 30
NVFP4_BITS = 4.5  # 4-bit values + an FP8 (8-bit) scale per group of 16
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LORA_DTYPE_BYTES = 4  # peft keeps adapter weights in float32 on a bf16 base


def planned_dtype(model: ModelConfig, placement: PlacementConfig) -> ComputeDtype:
    """model.dtype as the planned devices compute it: the placement's GPUs, or this machine's CPU."""
    return compute_dtype(model.dtype, local_device(placement.gpus_per_node))


def compute_bytes(cfg: PlanSections) -> int:
    """Bytes of one element of the planned compute dtype."""
    return DTYPE_BYTES[planned_dtype(cfg.model, cfg.placement).name]


class NoArchitecture(ValueError):
    """Nothing to estimate memory from: no config.json, no model.estimate, or an unknown layout."""


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
    softcapped_logits: bool = False  # final_logit_softcapping (Gemma 2): the head holds its logits twice

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
            return {
                "q_proj": (h, self.q_width),
                "k_proj": (h, self.kv_width),
                "v_proj": (h, self.kv_width),
                "o_proj": (self.q_width, h),
            }
        m = self.mla
        query = (
            {"q_a_proj": (h, m.q_rank), "q_b_proj": (m.q_rank, self.q_width)}
            if m.q_rank
            else {"q_proj": (h, self.q_width)}
        )
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
        return (
            self.num_layers * self._attention_linear_params
            + (self.num_layers - self.moe_layers) * self._dense_mlp_params
            + moe
        )

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
        return (
            self.packed_params * (NVFP4_BITS / 8 if nvfp4 else dtype_bytes)
            + (self.params - self.packed_params) * dtype_bytes
        )

    def routed_bytes(self, dtype_bytes: int, nvfp4: bool | None = None) -> float:
        nvfp4 = self.nvfp4 if nvfp4 is None else nvfp4
        return self.routed_params * (NVFP4_BITS / 8 if nvfp4 else dtype_bytes)

    def units(self, dtype_bytes: int, lora: LoraConfig | None) -> list[Unit]:
        """Every parameter of the trainer's module tree (see the module doc-string), by FSDP2
        unit: the dense blocks, the MoE blocks, the root (embeddings, final norm, lm_head)."""
        b, full = dtype_bytes, lora is None  # full fine-tuning: every tensor trains, at the model's dtype
        weight = NVFP4_BITS / 8 if self.nvfp4 else b

        def vectors(*sizes: int | None) -> list[ParamShape]:
            return [ParamShape(n, 1, b, full) for n in sizes if n]

        def linears(named: dict[str, tuple[int, int]]) -> list[ParamShape]:
            # what the engine applies (MLA: not kv_b_proj), as the run resolves it at start
            adapted = engine_lora_targets(lora.target_modules, named, uses_mla=self.mla is not None)[0] if lora else ()
            shapes = []
            for name, (inputs, outputs) in named.items():
                # Megatron splits a LoRA pair as its base: B's rows under a column-parallel output, A's inputs under a row-parallel input
                column = "rows" if LINEAR_SPLIT[name] == "column" else None
                row = "row_elements" if LINEAR_SPLIT[name] == "row" else None
                shapes.append(ParamShape(outputs, inputs, weight, full, column or row))
                if name in adapted:
                    shapes += [
                        ParamShape(lora.rank, inputs, LORA_DTYPE_BYTES, True, row),
                        ParamShape(outputs, lora.rank, LORA_DTYPE_BYTES, True, column),
                    ]
            return shapes

        latent_norms = (self.mla.q_rank, self.mla.kv_rank) if self.mla else ()
        attention = linears(self.attention_linears()) + vectors(self.hidden, self.hidden, *latent_norms)
        units = []
        if self.num_layers > self.moe_layers:
            dense = attention + linears(self.mlp_linears(self.intermediate_size))
            units.append(Unit("dense block", self.num_layers - self.moe_layers, tuple(dense)))
        if self.moe_layers:
            e, h = self.experts, self.hidden
            moe = [
                ParamShape(e.count, h, b, full),  # the router's gate
                ParamShape(
                    e.count, 2 * e.width * h, weight, full, "row_elements", "rows"
                ),  # gate/up: [E, 2 x width, hidden]
                ParamShape(e.count, h * e.width, weight, full, "row_elements", "rows"),
            ]  # down: [E, hidden, width]
            if e.shared_width:
                moe += linears(self.mlp_linears(e.shared_width))
            if lora and lora.target_experts:
                pairs = lora.rank * e.count  # lora_A [r x E, in], lora_B [out, r x E] of gate/up, then down
                moe += [
                    ParamShape(pairs, h, b, True, experts="rows"),
                    ParamShape(2 * e.width, pairs, b, True, experts="row_elements"),
                    ParamShape(pairs, e.width, b, True, experts="rows"),
                    ParamShape(h, pairs, b, True, experts="row_elements"),
                ]
            units.append(Unit("MoE block", self.moe_layers, tuple(attention + moe)))
        vocab = [ParamShape(self.vocab_size, self.hidden, b, full, "rows", stage=s) for s in ("first", "last")]
        norm = ParamShape(self.hidden, 1, b, full, stage="last")
        head = [] if self.tie_word_embeddings else [vocab[1]]
        units.append(Unit("root", 1, (vocab[0], norm, *head)))
        return units

    def adapter_params(self, lora: LoraConfig) -> int:
        """The LoRA adapter's parameters."""
        return sum(u.count * p.numel for u in self.units(LORA_DTYPE_BYTES, lora) for p in u.params if p.trainable)

    def adapted_params(self, lora: LoraConfig) -> int:
        """The weights of the Linear layers the adapter adapts: what merging it rewrites (routed
        experts' adapters aside: they are applied per expert, never merged)."""

        def adapted(named: dict[str, tuple[int, int]]) -> int:
            chosen = engine_lora_targets(lora.target_modules, named, uses_mla=self.mla is not None)[0]
            return sum(inputs * outputs for name, (inputs, outputs) in named.items() if name in chosen)

        e = self.experts
        shared = adapted(self.mlp_linears(e.shared_width)) if e and e.shared_width else 0
        return (
            self.num_layers * adapted(self.attention_linears())
            + self.moe_layers * shared
            + (self.num_layers - self.moe_layers) * adapted(self.mlp_linears(self.intermediate_size))
        )

    def block_bytes(self, dtype_bytes: int, lora: LoraConfig | None = None) -> float:
        """The largest decoder block unsharded, as FSDP2 gathers it (ParamShape.gathered_bytes)."""
        return max(u.gathered_bytes(dtype_bytes) for u in self.units(dtype_bytes, lora) if u.is_block)

    @property
    def active_mlp_width(self) -> int:
        """The widest MLP a token passes through: the dense one, or top_k routed + shared experts."""
        e = self.experts
        moe = e.top_k * e.width + e.shared_width if e else 0
        return max(moe, self.intermediate_size if self.num_layers > self.moe_layers else 0)

    def activation_bytes(
        self,
        tokens: int,
        dtype_bytes: int,
        checkpointing: bool,
        tensor_parallel: int = 1,
        sequence_parallel: bool = False,
    ) -> float:
        """What the decoder blocks keep for backward over `tokens` tokens (rlvr.planning.plan). Megatron's
        tensor parallel splits the attention's and MLP's inner values over its ranks; its sequence
        parallel the hidden-size ones too (the norms' values, the block inputs a recompute keeps)."""
        hidden_split = tensor_parallel if sequence_parallel else 1
        inner = 3 * self.q_width + 3 * self.kv_width + 4 * self.active_mlp_width
        per_token_layer = dtype_bytes * (6 * self.hidden / hidden_split + inner / tensor_parallel)
        if checkpointing:
            return tokens * self.num_layers * self.hidden * dtype_bytes / hidden_split + tokens * per_token_layer
        return tokens * self.num_layers * per_token_layer

    def logits_bytes(self, tokens: int, dtype_bytes: int, chunk_mb: float) -> float:
        """The LM head's logits working set over `tokens` scored tokens (rlvr.training.logits_memory)."""
        return working_bytes(tokens, chunk_mb * 1e6, self.vocab_size, dtype_bytes, self.softcapped_logits)

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
    return LatentAttention(
        kv_rank=text["kv_lora_rank"],
        q_rank=text.get("q_lora_rank"),
        nope=text["qk_nope_head_dim"],
        rope=text["qk_rope_head_dim"],
        v_head_dim=text["v_head_dim"],
    )


def read_architecture(cfg: PlanSections) -> Architecture:
    """From the model folder's config (config.json, or Mistral's params.json read as vLLM reads it)
    where there is a folder, else from model.estimate."""
    if cfg.folder is not None:
        raw, source = cfg.folder.config_dict, cfg.folder.config_file
        text = raw.get("text_config") or raw  # multimodal checkpoints keep the decoder's sizes there
        quant = raw.get("quantization_config") or {}
        if quant:
            if quant.get("format") != FORMAT_NAME:
                kind = quant.get("format") or quant.get("quant_method")
                raise NoArchitecture(f"{source}: quantization {kind!r} is not estimated")
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
            source=str(source),
            experts=_experts_from_config(text),
            mla=_mla_from_config(text),
            softcapped_logits=bool(text.get("final_logit_softcapping")),
        )
    e = cfg.model.estimate
    if e is None:
        raise NoArchitecture(f"no model folder at {cfg.model.path} and no model.estimate in the config")
    experts = None
    if e.num_experts:
        experts = Experts(
            count=e.num_experts,
            top_k=e.num_experts_per_tok,
            width=e.moe_intermediate_size,
            shared_width=e.num_shared_experts * e.moe_intermediate_size,
            first_dense=e.first_dense_layers,
        )
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
        mla=_mla_from_config(e.model_dump()),  # model.estimate names MLA's sizes as config.json does
    )
