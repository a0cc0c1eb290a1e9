"""Total and active parameter counts from a config (rlvr.models.params), against transformers'
own count of the built model and against each architecture's published layer formulas."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlvr.models.params import parameter_counts
from rlvr.models.tiny import build_tiny_model

SIZES = dict(hidden_size=64, num_heads=4, num_kv_heads=2, num_layers=3, intermediate_size=128)


def _formula(c) -> tuple[int, int]:
    """(total, active) written out per architecture from its config."""
    H, V, N = c.hidden_size, c.vocab_size, c.num_hidden_layers
    embeddings = V * H * (1 if c.tie_word_embeddings else 2) + H  # + final norm
    if c.model_type == "deepseek_v3":
        h, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        attention = (H * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * h * qk  # q_a, its norm, q_b
                     + H * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank  # kv_a (latent + rope key), its norm
                     + c.kv_lora_rank * h * (c.qk_nope_head_dim + c.v_head_dim) + h * c.v_head_dim * H)  # kv_b, o  # fmt: skip
        dense, moe = c.first_k_dense_replace, N - c.first_k_dense_replace
        expert, experts, top_k = 3 * H * c.moe_intermediate_size, c.n_routed_experts, c.num_experts_per_tok
        shared = c.n_shared_experts * expert
        fixed = (
            embeddings + N * (attention + 2 * H) + dense * 3 * H * c.intermediate_size + moe * (experts * H + shared)
        )
    else:
        d = c.head_dim or H // c.num_attention_heads
        attention = H * d * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
        attention += 2 * d if c.model_type == "qwen3_moe" else 0  # q_norm, k_norm
        experts = getattr(c, "num_experts", None) or c.num_local_experts
        expert = 3 * H * (getattr(c, "moe_intermediate_size", None) or c.intermediate_size)
        top_k, moe = c.num_experts_per_tok, N
        fixed = embeddings + N * (attention + 2 * H + experts * H)  # router per layer
    return fixed + moe * experts * expert, fixed + moe * top_k * expert


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_moe", "mixtral", "qwen2"])
def test_counts_match_transformers_and_the_architecture_formulas(arch, tmp_path):
    model_dir = build_tiny_model(tmp_path, arch, **SIZES)
    config = AutoConfig.from_pretrained(model_dir)
    counts = parameter_counts(config)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert counts.total == model.num_parameters()
    routed = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert counts.routed_experts == routed
    if arch == "qwen2":
        assert (counts.active, counts.moe_layers, counts.num_experts) == (counts.total, 0, 0)
        return
    assert (counts.total, counts.active) == _formula(config)
    assert counts.active == counts.total - routed + routed * counts.top_k // counts.num_experts
    assert counts.embeddings == config.vocab_size * config.hidden_size  # tied head counted once


def test_deepseek_v3_full_size_config_gives_its_published_671b_total_and_37b_active():
    counts = parameter_counts(AutoConfig.for_model("deepseek_v3"))  # transformers' defaults are DeepSeek-V3's
    assert round(counts.total / 1e9) == 671 and round(counts.active / 1e9, 1) == 37.6
    assert (counts.moe_layers, counts.num_experts, counts.top_k) == (58, 256, 8)
