"""Megatron's core attention replaced by rlvr's packed attention (rlvr.training.attention), so a
Megatron rank attends a packed micro-batch exactly as an FSDP2 rank does: each sequence alone,
a shared prompt seen by each of its completions. Megatron's own local `DotProductAttention`
takes one dense mask and no packed sequences (those need TransformerEngine)."""

from __future__ import annotations

from megatron.core.transformer.module import MegatronModule

from rlvr.training.attention import PackedLayout, packed_attention


class PackedCoreAttention(MegatronModule):
    """Takes `core_attention`'s place in megatron-core's layer spec. The row's `PackedLayout`
    arrives where Megatron passes its attention mask, untouched down to here."""

    def __init__(
        self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None, softmax_scale=None, **unused
    ):
        super().__init__(config=config)
        # MLA passes its own scale (its query/key head is wider than its value head)
        self.scale = softmax_scale or config.softmax_scale or config.kv_channels**-0.5

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, **unused):
        """`[s, 1, heads, dim]` query, `[s, 1, groups, dim]` key and value (this rank's heads) in,
        `[s, 1, heads x value dim]` out."""
        layout = attention_mask if isinstance(attention_mask, PackedLayout) else None
        heads = [x.permute(1, 2, 0, 3) for x in (query, key, value)]  # [1, heads, s, dim]
        out, _ = packed_attention(self, *heads, None, scaling=self.scale, rlvr_layout=layout)
        return out.transpose(0, 1).reshape(query.shape[0], 1, -1)  # [1, s, h, d] -> [s, 1, h x d]
