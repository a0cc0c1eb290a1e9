"""Tiny causal LMs built locally, with a character-level tokenizer and a chat template.

No model hub is reachable on the machines this project is tested on, so the demo and the
tests build their models here: any transformers architecture, random weights, a tokenizer
whose tokens are single characters (so every string is representable), saved with
`save_pretrained` so that transformers, peft and vLLM load the folder like any HF model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

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
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
        "first_k_dense_replace": 1, "num_nextn_predict_layers": 0, "routed_scaling_factor": 2.5,
    },  # fmt: skip
}


def _scaled_extras(arch: str, hidden_size: int, num_heads: int, intermediate_size: int) -> dict:
    """Extras that follow the shared sizes (every Linear input a multiple of 16 for NVFP4)."""
    head_dim = hidden_size // num_heads
    if arch == "deepseek_v3":
        return {
            "q_lora_rank": hidden_size // 2,
            "kv_lora_rank": hidden_size // 2,
            "qk_rope_head_dim": head_dim // 2,
            "qk_nope_head_dim": head_dim // 2,
            "v_head_dim": head_dim,
            "moe_intermediate_size": intermediate_size // 4,
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
):
    if arch not in _ARCH_EXTRAS:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {', '.join(sorted(_ARCH_EXTRAS))}")
    extras = {**_ARCH_EXTRAS[arch], **_scaled_extras(arch, hidden_size, num_heads, intermediate_size)}
    return AutoConfig.for_model(
        arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
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
    **sizes,
) -> Path:
    """Build a random tiny causal LM with the char tokenizer and save both to `out_dir`."""
    out_dir = Path(out_dir)
    tokenizer = build_char_tokenizer()
    config = tiny_config(
        arch,
        # room above the tokenizer's ids: some tokenizer classes add a token when loading
        vocab_size=-(-(len(tokenizer) + 1) // 64) * 64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sizes,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
