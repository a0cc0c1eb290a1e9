"""An MLA + MoE HF config.json (DeepSeek-V3, and `mistral4`: Mistral Large 3 and Small 4) as
megatron-core's GPTModel: multi-latent attention (MLA), the first layers dense, then routed experts
beside shared experts; built with megatron-core's local layer spec (no TransformerEngine), the
routed experts split by expert parallel, and rlvr's packed attention in place of its core attention.

The two families route differently: DeepSeek-V3 chooses by group-limited sigmoid scores plus a
correction bias that only chooses; `mistral4` by a softmax over every expert. Both normalise the
chosen weights and scale them. `mistral4` also scales each query by its position (llama-4's
`1 + beta log(1 + floor(position / original))`), and both may stretch their rotary angles by YaRN.

What matches transformers' model exactly rather than by default:

- rotary positions: megatron-core's MLA reads its rotary dimensions as interleaved pairs, as
  DeepSeek stores them (transformers' `rope_interleave: true`), but it rotates positions 0..L-1
  of the row; each MLA layer's rotary embedding here takes the row's position ids instead
  (restarting at each packed sequence, continuing from a shared prompt), as the dense path does;
- YaRN: megatron-core multiplies the angles' cos/sin by mscale(mscale) / mscale(mscale_all_dim)
  and the softmax scale by mscale(mscale_all_dim)^2; transformers by its `attention_factor` and the
  same square. `mscale_all_dim` is passed as it is and `mscale` is solved for so that the first
  ratio is transformers' attention factor, whichever way the config gives it;
- routing: a group's score is the sum of its top topk/topk_group experts' scores in megatron-core,
  of its top 2 in transformers, so only models where the two agree are converted; DeepSeek-V3's
  router logits are computed in float32, `mistral4`'s in the compute dtype, as transformers
  computes each."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core.extensions import transformer_engine
from megatron.core.models.common.embeddings import RotaryEmbedding
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer import multi_latent_attention
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher
from megatron.core.transformer.transformer_config import MLATransformerConfig
from torch import nn

from rlvr.models.moe import MoELayer
from rlvr.training.attention import PackedLayout
from rlvr.training.megatron.attention import PackedCoreAttention
from rlvr.training.megatron.gpt import decoder_settings

LATENT = ("deepseek_v3", "mistral4")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention-temperature term, as transformers and megatron-core both define it."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class Yarn:
    """YaRN's rotary stretch (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large
    Language Models") as transformers reads it from `rope_parameters`."""

    factor: float
    original_max_positions: int
    beta_fast: float
    beta_slow: float
    attention_factor: float  # the angles' cos and sin are multiplied by it
    mscale_all_dim: float  # the softmax scale is multiplied by yarn_mscale(factor, mscale_all_dim)^2

    @classmethod
    def of(cls, rope: dict, max_positions: int) -> Yarn:
        original = rope["original_max_position_embeddings"]
        factor = rope.get("factor") or max_positions / original
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        attention_factor = rope.get("attention_factor")
        if attention_factor is None:
            attention_factor = (
                yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                if mscale and mscale_all_dim
                else yarn_mscale(factor)
            )
        return cls(
            factor=factor,
            original_max_positions=original,
            beta_fast=rope.get("beta_fast") or 32.0,
            beta_slow=rope.get("beta_slow") or 1.0,
            attention_factor=attention_factor,
            mscale_all_dim=mscale_all_dim or 0.0,
        )

    def megatron_settings(self) -> dict:
        """MLATransformerConfig's YaRN fields giving transformers' angles and softmax scale."""
        # megatron-core's cos/sin factor is yarn_mscale(f, mscale) / yarn_mscale(f, mscale_all_dim):
        # solve for the mscale that makes it the attention factor (LatentShape.of refuses a factor <= 1)
        all_dims = yarn_mscale(self.factor, self.mscale_all_dim)
        mscale = (self.attention_factor * all_dims - 1.0) / (0.1 * math.log(self.factor))
        return dict(
            rope_type="yarn",
            rotary_scaling_factor=self.factor,
            original_max_position_embeddings=self.original_max_positions,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            mscale=mscale,
            mscale_all_dim=self.mscale_all_dim,
        )


@dataclass(frozen=True)
class LatentShape:
    """What the conversion and the model read from a DeepSeek-V3 config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    q_lora_rank: int | None  # None: one query projection, no low-rank query
    kv_lora_rank: int
    nope_dim: int  # per head: the query/key dimensions without rotary positions
    rope_dim: int  # ... and with them (one key part shared by every head)
    v_dim: int
    ffn_size: int  # the dense layers' MLP
    dense_layers: int  # the first layers are dense, the rest MoE
    experts: int
    top_k: int
    groups: int
    top_groups: int
    expert_ffn_size: int
    shared_ffn_size: int
    scaling: float
    softmax_routing: bool  # mistral4: a softmax over every expert; DeepSeek-V3: sigmoid + correction bias
    norm_eps: float
    rope_theta: float
    yarn: Yarn | None
    query_scale_beta: float | None  # mistral4's llama-4 query scaling by position
    max_positions: int
    tied: bool

    @classmethod
    def of(cls, config) -> LatentShape:
        where = f"model config.json (model_type {config.model_type!r})"
        if config.model_type not in LATENT:
            raise ValueError(f"{where}: trainer.backend=megatron converts MLA models of {', '.join(LATENT)}")
        rope = config.rope_parameters or {"rope_type": "default"}
        rope_type = rope.get("rope_type", "default")
        softmax_routing = config.model_type == "mistral4"
        yarn = Yarn.of(rope, config.max_position_embeddings) if rope_type == "yarn" else None
        refusals = {
            rope_type not in ("default", "yarn"): f"no {rope_type!r} rotary scaling",
            yarn is not None and yarn.factor <= 1: "reads YaRN with a factor above 1 only",
            rope_type == "yarn" and rope.get("truncate") is False: (
                "rounds YaRN's correction range to whole dimensions (rope_parameters.truncate: true) only"
            ),
            softmax_routing and rope_type != "yarn": "converts mistral4 models with YaRN rotary scaling only",
            not config.rope_interleave: "reads MLA's rotary dimensions interleaved (rope_interleave: true) only",
            bool(config.attention_bias): "converts unbiased MLA projections only",
            config.hidden_act != "silu": "converts SwiGLU MLPs only",
            not config.norm_topk_prob and config.num_experts_per_tok > 1: "normalises the chosen experts' weights",
            softmax_routing and config.n_group > 1: "routes softmax scores over one expert group (n_group: 1) only",
            config.n_group > 1 and config.num_experts_per_tok // config.topk_group != 2: (
                "scores an expert group by its top 2 experts, as transformers does, only where megatron-core's "
                "num_experts_per_tok / topk_group is 2"
            ),
        }
        for refused, why in refusals.items():
            if refused:
                raise ValueError(f"{where}: trainer.backend=megatron {why}")
        return cls(
            model_type=config.model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            q_lora_rank=config.q_lora_rank,
            kv_lora_rank=config.kv_lora_rank,
            nope_dim=config.qk_nope_head_dim,
            rope_dim=config.qk_rope_head_dim,
            v_dim=config.v_head_dim,
            ffn_size=config.intermediate_size,
            dense_layers=min(config.first_k_dense_replace, config.num_hidden_layers),
            experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            groups=config.n_group,
            top_groups=config.topk_group,
            expert_ffn_size=config.moe_intermediate_size,
            shared_ffn_size=config.moe_intermediate_size * (config.n_shared_experts or 0),
            scaling=config.routed_scaling_factor,
            softmax_routing=softmax_routing,
            norm_eps=config.rms_norm_eps,
            rope_theta=rope.get("rope_theta", 10000.0),
            yarn=yarn,
            query_scale_beta=rope.get("llama_4_scaling_beta") if softmax_routing else None,
            max_positions=config.max_position_embeddings,
            tied=bool(config.tie_word_embeddings),
        )

    def check_split(self, tensor_parallel: int, expert_parallel: int) -> None:
        if tensor_parallel > 1:  # megatron-core's MoE with tensor parallel needed CUDA when probed on CPU
            raise ValueError(
                f"trainer.megatron.tensor_parallel={tensor_parallel}: an MLA/MoE model is split by "
                "expert_parallel alone; tensor_parallel must be 1"
            )
        if self.experts % expert_parallel:
            raise ValueError(
                f"trainer.megatron.expert_parallel={expert_parallel} must divide the model's "
                f"n_routed_experts ({self.experts})"
            )


def transformer_config(
    shape: LatentShape, tensor_parallel: int, expert_parallel: int, dtype: torch.dtype
) -> MLATransformerConfig:
    return MLATransformerConfig(
        **decoder_settings(shape, tensor_parallel, dtype),
        q_lora_rank=shape.q_lora_rank,
        kv_lora_rank=shape.kv_lora_rank,
        qk_head_dim=shape.nope_dim,
        qk_pos_emb_head_dim=shape.rope_dim,
        v_head_dim=shape.v_dim,
        qk_layernorm=True,  # the norms of the query and key/value latents
        rotary_base=shape.rope_theta,
        **(shape.yarn.megatron_settings() if shape.yarn else {"rope_type": "rope"}),
        num_moe_experts=shape.experts,
        moe_layer_freq=[0] * shape.dense_layers + [1] * (shape.layers - shape.dense_layers),
        moe_ffn_hidden_size=shape.expert_ffn_size,
        moe_shared_expert_intermediate_size=shape.shared_ffn_size or None,
        moe_router_topk=shape.top_k,
        moe_router_num_groups=shape.groups if shape.groups > 1 else None,
        moe_router_group_topk=shape.top_groups if shape.groups > 1 else None,
        # softmax over the chosen experts' logits alone is the normalised softmax over all of them
        moe_router_score_function="softmax" if shape.softmax_routing else "sigmoid",
        moe_router_enable_expert_bias=not shape.softmax_routing,
        moe_router_bias_update_rate=0.0,  # the correction bias is the checkpoint's, not trained here
        moe_router_topk_scaling_factor=shape.scaling,
        moe_router_dtype=None if shape.softmax_routing else "fp32",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        # alltoall sends each token to its experts' rank alone, but makes a CUDA stream at build;
        # allgather (every rank sees every token, keeps its experts' share) runs on CPU too
        moe_token_dispatcher_type="alltoall" if torch.cuda.is_available() else "allgather",
        moe_permute_fusion=False,
        expert_model_parallel_size=expert_parallel,
    )


class PositionedRotary(nn.Module):
    """An MLA layer's rotary embedding at the row's position ids (`positions`, set before each
    forward) instead of at 0..L-1."""

    def __init__(self, rotary: RotaryEmbedding, positions: RowPositions):
        super().__init__()
        self.rotary, self.positions = rotary, positions

    def get_rotary_seq_len(self, *args, **kwargs) -> int:
        return self.rotary.get_rotary_seq_len(*args, **kwargs)

    def forward(self, seq_len: int, packed_seq: bool = False):
        at = self.positions.ids
        angles = self.rotary(int(at.max()) + 1)  # YaRN's: (angles, its cos/sin factor)
        if isinstance(angles, tuple):
            return angles[0].index_select(0, at), angles[1]
        return angles.index_select(0, at)  # [L, 1, 1, rope_dim]


class PositionScaledQuery(nn.Module):
    """llama-4's query scaling (transformers' `mistral4`): each query times
    `1 + beta log(1 + floor(position / original))` at the row's position ids, ahead of the core
    attention it wraps, so long contexts keep their attention sharp past the original length."""

    def __init__(self, attention: nn.Module, positions: RowPositions, beta: float, original: int):
        super().__init__()
        self.attention, self.positions, self.beta, self.original = attention, positions, beta, original

    def forward(self, query, *args, **kwargs):
        scale = 1 + self.beta * torch.log(1 + torch.floor(self.positions.ids / self.original))
        return self.attention(query * scale.to(query.dtype)[:, None, None, None], *args, **kwargs)


class EvenAllGatherDispatcher(MoEAllGatherTokenDispatcher):
    """megatron-core's allgather dispatcher for ranks whose rows differ in length: it gathers
    equal shares (Megatron's own ranks run equal sequences), so each rank's tokens are padded to
    the group's longest row, routed nowhere, and cut off again after the experts."""

    def token_dispatch(self, hidden_states, probs):
        self.tokens = hidden_states.shape[0]
        most = torch.tensor([self.tokens], device=hidden_states.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.tp_ep_group)
        pad = int(most) - self.tokens
        if pad:
            hidden_states, probs = (torch.cat([x, x.new_zeros(pad, x.shape[1])]) for x in (hidden_states, probs))
            self.routing_map = torch.cat([self.routing_map, self.routing_map.new_zeros(pad, self.routing_map.shape[1])])
        return super().token_dispatch(hidden_states, probs)

    def token_combine(self, hidden_states):
        return super().token_combine(hidden_states)[: self.tokens]


class RowPositions:
    """The position ids of the row being scored, shared by every layer's PositionedRotary."""

    ids: torch.Tensor


def build_gpt(shape: LatentShape, tensor_parallel: int, expert_parallel: int, dtype: torch.dtype) -> GPTModel:
    """This rank's part of the model (its own routed experts), its weights not yet read."""
    shape.check_split(tensor_parallel, expert_parallel)
    if not transformer_engine.HAVE_TE:
        # without TransformerEngine megatron-core defines its TE layers over a MagicMock, which MLA's
        # isinstance check cannot take, and leaves the router's TE matmul undefined, not None
        multi_latent_attention.HAVE_TE = False
        moe_utils.te_general_gemm = None
    config = transformer_config(shape, tensor_parallel, expert_parallel, dtype)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    for layer in spec.layer_specs:
        layer.submodules.self_attention.submodules.core_attention = PackedCoreAttention
    gpt = GPTModel(
        config,
        spec,
        vocab_size=shape.vocab_size,
        max_sequence_length=shape.max_positions,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=shape.tied,
    )
    gpt.row_positions = RowPositions()
    for block in gpt.decoder.layers:
        attention = block.self_attention
        attention.rotary_pos_emb = PositionedRotary(attention.rotary_pos_emb, gpt.row_positions)
        if shape.query_scale_beta is not None:
            assert shape.yarn is not None  # LatentShape.of: mistral4 comes with YaRN
            attention.core_attention = PositionScaledQuery(
                attention.core_attention, gpt.row_positions, shape.query_scale_beta, shape.yarn.original_max_positions
            )
        dispatcher = getattr(block.mlp, "token_dispatcher", None)
        if type(dispatcher) is MoEAllGatherTokenDispatcher:
            dispatcher.__class__ = EvenAllGatherDispatcher
    return gpt


def final_hidden(
    model: GPTModel, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: PackedLayout | None
) -> torch.Tensor:
    """`[L, hidden]`: the last norm's output at each token of a packed row `[1, L]`."""
    model.row_positions.ids = position_ids[0]
    hidden = model.embedding(input_ids=input_ids, position_ids=None)  # [L, 1, hidden]
    return model.decoder(hidden_states=hidden, attention_mask=layout)[:, 0]


def moe_layers(model: GPTModel) -> list[MoELayer]:
    """The model's MoE layers in forward order, for routing replay (rlvr.models.routing)."""
    return [
        MoELayer(
            f"decoder.layers.{i}.mlp.router",
            block.mlp.router,
            f"decoder.layers.{i}.mlp.experts",
            block.mlp.experts,
            block.mlp.router.topk,
            block.mlp.config.num_moe_experts,
        )
        for i, block in enumerate(model.decoder.layers)
        if hasattr(block.mlp, "router")
    ]
