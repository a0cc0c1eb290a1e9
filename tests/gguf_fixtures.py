"""A tiny Llama written as a GGUF file with the `gguf` package, the way llama.cpp's converter lays
one out: its tensor names, its Q/K row permutation (llama.cpp rotates halves, not pairs), the
byte-level BPE tokenizer and the chat template as metadata. No GGUF file is downloadable here,
so the import tests make their own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.models.tiny import build_tiny_model

SIZES = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
_LAYER_TENSORS = {  # HF name inside a layer -> GGUF name inside blk.N
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order: each head's rotary halves interleaved."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_tiny_llama_gguf(hf_dir: Path, path: Path, quant: str | None = None) -> Path:
    """Write the HF Llama folder `hf_dir` as the GGUF file `path`; `quant` (e.g. "Q8_0", "Q4_1")
    packs the 2-D weights, norms stay F32 as llama.cpp keeps them."""
    import gguf

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    c = model.config
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    writer.add_vocab_size(c.vocab_size)

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    tokens = [token for token, _ in vocab] + [f"<unused{i}>" for i in range(c.vocab_size - len(vocab))]
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_scores([0.0] * len(tokens))  # no merges to write: transformers derives none from these
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)

    qtype = getattr(gguf.GGMLQuantizationType, quant) if quant else None

    def add(name: str, weight: torch.Tensor) -> None:
        array = weight.detach().float().numpy()
        if qtype is not None and array.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)

    state = model.state_dict()
    add("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        for hf_name, gguf_name in _LAYER_TENSORS.items():
            weight = state[f"model.layers.{i}.{hf_name}"]
            if hf_name.startswith("self_attn.q_proj"):
                weight = torch.from_numpy(_permute(weight.numpy(), c.num_attention_heads))
            elif hf_name.startswith("self_attn.k_proj"):
                weight = torch.from_numpy(_permute(weight.numpy(), c.num_key_value_heads))
            add(f"blk.{i}.{gguf_name}", weight)
    add("output_norm.weight", state["model.norm.weight"])
    if not c.tie_word_embeddings:
        add("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_llama_gguf(tmp: Path, quant: str | None = None) -> tuple[Path, Path]:
    """(the HF folder, the GGUF file written from it) under `tmp`."""
    hf_dir = build_tiny_model(tmp / "hf", arch="llama", **SIZES)
    return hf_dir, write_tiny_llama_gguf(hf_dir, tmp / f"tiny-{quant or 'F32'}.gguf", quant)
