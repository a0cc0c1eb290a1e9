"""A dense Mistral model in Mistral's own layout, written from a Hugging Face one as Mistral's
checkpoints spell it (the reading side is vLLM's `maybe_remap_mistral`, which the tests check)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from rlvr.models.mistral_layout import PARAMS_FILE, WEIGHTS_FILE

_DENSE_NAMES = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "output", "self_attn": "attention",
                "q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo", "mlp": "feed_forward", "gate_proj": "w1",
                "down_proj": "w2", "up_proj": "w3", "input_layernorm": "attention_norm",
                "post_attention_layernorm": "ffn_norm"}  # fmt: skip


def _interleave_rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """HF's rotate-half rows of q/k back to Mistral's interleaved pairs (vLLM's permute, inverted)."""
    rows, columns = weight.shape
    return weight.view(heads, 2, rows // heads // 2, columns).transpose(1, 2).reshape(rows, columns)


def write_dense_mistral_folder(hf_model, folder: Path) -> Path:
    """`hf_model` (transformers' `mistral`, tied embeddings) as params.json and consolidated.safetensors."""
    c = hf_model.config
    params = {"dim": c.hidden_size, "n_layers": c.num_hidden_layers, "head_dim": c.head_dim, "hidden_dim": c.intermediate_size,
              "n_heads": c.num_attention_heads, "n_kv_heads": c.num_key_value_heads, "norm_eps": c.rms_norm_eps,
              "vocab_size": c.vocab_size, "rope_theta": c.rope_parameters["rope_theta"], "tied_embeddings": True,
              "max_position_embeddings": c.max_position_embeddings}  # fmt: skip
    stored = {}
    for key, tensor in hf_model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied
        if ".q_proj." in key or ".k_proj." in key:
            tensor = _interleave_rope_rows(
                tensor, c.num_attention_heads if ".q_proj." in key else c.num_key_value_heads
            )
        name = key.replace("model.layers", "layers")
        for hf_part, mistral_part in _DENSE_NAMES.items():
            name = re.sub(rf"(^|\.){re.escape(hf_part)}\.", rf"\g<1>{mistral_part}.", name)
        stored[name] = tensor.contiguous()
    folder.mkdir(parents=True)
    (folder / PARAMS_FILE).write_text(json.dumps(params))
    save_file(stored, folder / WEIGHTS_FILE)
    return folder
