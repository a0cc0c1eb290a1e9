"""A transformers config from `model.estimate`'s numbers: the model a run would load, before its
checkpoint is downloaded, to build on the meta device (`rlvr rehearse`).

Multi-head latent attention (kv_lora_rank set) is DeepSeek-V3's module tree, which is how vLLM and
transformers serve Mistral Large 3 and Kimi; routed experts without MLA are Qwen2-MoE's (shared
experts included); a dense model is Llama's.
"""

from __future__ import annotations

from transformers import DeepseekV3Config, LlamaConfig, PretrainedConfig, Qwen2MoeConfig

from rlvr.config import ArchitectureEstimate


def estimate_config(e: ArchitectureEstimate) -> PretrainedConfig:
    common = dict(
        hidden_size=e.hidden_size,
        num_hidden_layers=e.num_layers,
        intermediate_size=e.intermediate_size,
        num_attention_heads=e.num_heads,
        num_key_value_heads=e.num_kv_heads,
        vocab_size=e.vocab_size,
        tie_word_embeddings=e.tie_word_embeddings,
    )
    if e.kv_lora_rank:
        moe = (
            dict(
                n_routed_experts=e.num_experts,
                num_experts_per_tok=e.num_experts_per_tok,
                moe_intermediate_size=e.moe_intermediate_size,
                n_shared_experts=e.num_shared_experts,
                first_k_dense_replace=e.first_dense_layers,
            )
            if e.num_experts
            else dict(first_k_dense_replace=e.num_layers)
        )
        return DeepseekV3Config(
            **common,
            **moe,
            q_lora_rank=e.q_lora_rank,
            kv_lora_rank=e.kv_lora_rank,
            qk_nope_head_dim=e.qk_nope_head_dim,
            qk_rope_head_dim=e.qk_rope_head_dim,
            v_head_dim=e.v_head_dim,
            n_group=1,
            topk_group=1,
        )
    head_dim = e.head_dim or e.hidden_size // e.num_heads
    if e.num_experts:
        return Qwen2MoeConfig(
            **common,
            head_dim=head_dim,
            num_experts=e.num_experts,
            num_experts_per_tok=e.num_experts_per_tok,
            moe_intermediate_size=e.moe_intermediate_size,
            shared_expert_intermediate_size=e.num_shared_experts * e.moe_intermediate_size,
            mlp_only_layers=list(range(e.first_dense_layers)),
            qkv_bias=False,
        )
    return LlamaConfig(**common, head_dim=head_dim)
