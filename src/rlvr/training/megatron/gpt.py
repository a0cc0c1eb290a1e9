"""A dense decoder's HF config.json as megatron-core's GPTModel: Llama, Qwen2 and Mistral (grouped
query attention, rotary positions with the config's scaling, SwiGLU, RMSNorm; Qwen2's biased
q/k/v), built with megatron-core's local layer spec (no TransformerEngine) and rlvr's packed
attention in place of its core attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from rlvr.training.attention import PackedLayout
from rlvr.training.megatron.attention import PackedCoreAttention

DENSE = ("llama", "qwen2", "mistral")
# transformers recomputes these types' frequencies from each forward's length; megatron-core's
# rotary embedding holds one set
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class DenseShape:
    """What the conversion and the model read from config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    groups: int  # key/value heads
    head_dim: int
    ffn_size: int
    norm_eps: float
    rope_theta: float
    # a scaled rotary embedding (llama3, yarn, linear, ...), as transformers computes it from the
    # config: its inverse frequencies (None: rope_theta's own), and the factor its cos and sin
    # carry, which scales each attention logit by its square
    inv_freq: tuple[float, ...] | None
    attention_factor: float
    max_positions: int
    tied: bool
    qkv_bias: bool

    @classmethod
    def of(cls, config, qkv_bias: bool) -> DenseShape:
        """`config`: transformers' config of the folder; `qkv_bias`: whether its files hold q/k/v biases."""
        where = f"model config.json (model_type {config.model_type!r})"
        if config.model_type not in DENSE:
            raise ValueError(f"{where}: trainer.backend=megatron converts {', '.join(DENSE)} models")
        rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": config.rope_theta}
        rope_type = rope.get("rope_type", "default")
        if rope_type in LENGTH_DEPENDENT_ROPE:
            raise ValueError(
                f"{where}: trainer.backend=megatron has no {rope_type!r} rotary scaling (its frequencies change "
                "with the sequence's length)"
            )
        inv_freq, attention_factor = None, 1.0
        if rope_type != "default":
            # transformers' own function for the type, so the angles are the ones its model rotates by
            freqs, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
            inv_freq = tuple(freqs.tolist())
        if getattr(config, "use_sliding_window", False) or getattr(config, "sliding_window", None):
            raise ValueError(f"{where}: trainer.backend=megatron has no sliding-window attention")
        if config.hidden_act != "silu" or getattr(config, "mlp_bias", False):
            raise ValueError(f"{where}: trainer.backend=megatron converts an unbiased SwiGLU MLP")
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        if inv_freq is not None and 2 * len(inv_freq) != head_dim:
            raise ValueError(f"{where}: trainer.backend=megatron rotates every dimension of a head (no partial rotary)")
        return cls(
            model_type=config.model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=heads,
            groups=config.num_key_value_heads or heads,
            head_dim=head_dim,
            ffn_size=config.intermediate_size,
            norm_eps=config.rms_norm_eps,
            rope_theta=rope["rope_theta"],
            inv_freq=inv_freq,
            attention_factor=float(attention_factor),
            max_positions=config.max_position_embeddings,
            tied=bool(config.tie_word_embeddings),
            qkv_bias=qkv_bias,
        )

    def check_split(self, tensor_parallel: int) -> None:
        """Tensor parallel splits key/value heads, the MLP's hidden columns and the vocabulary."""
        for what, size in (
            ("key/value heads", self.groups),
            ("intermediate_size", self.ffn_size),
            ("vocab_size", self.vocab_size),
        ):
            if size % tensor_parallel:
                raise ValueError(
                    f"trainer.megatron.tensor_parallel={tensor_parallel} must divide the model's {what} ({size})"
                )


def decoder_settings(shape, tensor_parallel: int, dtype: torch.dtype) -> dict:
    """TransformerConfig's settings every converted family shares: an RMSNorm SwiGLU decoder of
    unbiased linears, no dropout, weights read from the folder. `shape`: DenseShape or
    rlvr.training.megatron.mla.LatentShape."""
    return dict(
        num_layers=shape.layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.heads,
        ffn_hidden_size=shape.ffn_size,
        normalization="RMSNorm",
        layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tensor_parallel,
        params_dtype=dtype,
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is read from the folder
        # megatron-core's fusions are CUDA kernels: off, so each op is the plain torch one on any device
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
    )


def transformer_config(shape: DenseShape, tensor_parallel: int, dtype: torch.dtype) -> TransformerConfig:
    return TransformerConfig(
        **decoder_settings(shape, tensor_parallel, dtype),
        num_query_groups=shape.groups,
        kv_channels=shape.head_dim,
        add_qkv_bias=shape.qkv_bias,
        softmax_scale=shape.attention_factor**2 * shape.head_dim**-0.5,
    )


def build_gpt(shape: DenseShape, tensor_parallel: int, dtype: torch.dtype) -> GPTModel:
    """This rank's part of the model, its weights not yet read (rlvr.training.megatron.weights)."""
    shape.check_split(tensor_parallel)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = PackedCoreAttention
    model = GPTModel(
        transformer_config(shape, tensor_parallel, dtype),
        spec,
        vocab_size=shape.vocab_size,
        max_sequence_length=shape.max_positions,
        position_embedding_type="rope",
        rotary_base=shape.rope_theta,  # type: ignore[arg-type]  # annotated int; used as a float
        share_embeddings_and_output_weights=shape.tied,
    )
    if shape.inv_freq is not None:
        model.rotary_pos_emb.inv_freq = torch.tensor(shape.inv_freq, dtype=torch.float32)
    return model


def final_hidden(
    model: GPTModel, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: PackedLayout | None
) -> torch.Tensor:
    """`[L, hidden]`: the last norm's output at each token of a packed row `[1, L]`. Rotary angles
    follow position_ids (restarting at each packed sequence), not the row's offsets, as in HF."""
    hidden = model.embedding(input_ids=input_ids, position_ids=None)  # [L, 1, hidden]
    angles = model.rotary_pos_emb(int(position_ids.max()) + 1)  # [positions, 1, 1, dim]
    rotary = angles.index_select(0, position_ids[0])
    return model.decoder(hidden_states=hidden, attention_mask=layout, rotary_pos_emb=rotary)[:, 0]
