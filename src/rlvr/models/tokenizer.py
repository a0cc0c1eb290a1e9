"""The one way rlvr builds a model's tokenizer, and renders chat messages to token ids with it.

Mistral ships its tokenizer as `tekken.json` (older models `tokenizer.model.v*`), read by its own
library, mistral-common. vLLM reads such a folder with `tokenizer_mode="mistral"` whenever it
also holds `consolidated*.safetensors` (`vllm.tokenizers.registry.resolve_tokenizer_args`), and
transformers' `AutoTokenizer` turns a `tekken.json` without a `config.json` into a plain BPE
tokenizer with no chat template. rlvr takes mistral-common for the same folders vLLM does,
through the same class vLLM wraps (`MistralCommonBackend` in validation mode "test"), so the
engine and the trainer read the same ids.

mistral-common renders a conversation straight to ids: its control tokens (`[INST]`, `</s>`)
are not text, so a rendered string tokenised again is another sequence (`[INST]` becomes five
text tokens). `chat_ids` therefore asks every tokenizer for ids, never for text; for a Hugging
Face tokenizer the two are the same (transformers tokenises the rendered text without adding
special tokens).
"""

from __future__ import annotations

from pathlib import Path

MISTRAL_TOKENIZER_FILES = ("tekken.json", "tokenizer.model.v*")
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def uses_mistral_tokenizer(path: str | Path) -> bool:
    """Whether the folder's tokenizer is mistral-common's: a Mistral tokenizer file, in a folder of
    Mistral's layout (as vLLM decides) or with no Hugging Face tokenizer beside it."""
    folder = Path(path)
    if not folder.is_dir() or not any(any(folder.glob(p)) for p in MISTRAL_TOKENIZER_FILES):
        return False
    return any(folder.glob("consolidated*.safetensors")) or not any((folder / n).is_file() for n in HF_TOKENIZER_FILES)


def load_tokenizer(path: str | Path):
    """The tokenizer of the model folder `path` (rules in the module doc)."""
    if uses_mistral_tokenizer(path):
        from mistral_common.protocol.instruct.validator import ValidationMode
        from transformers.tokenization_mistral_common import MistralCommonBackend

        # "test" mode, as vLLM's MistralTokenizer insists: a conversation may end with a user
        # or a tool message without the validator asking for the next assistant turn's rules
        return MistralCommonBackend.from_pretrained(str(path), mode=ValidationMode.test)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def is_mistral_tokenizer(tokenizer) -> bool:
    from transformers.tokenization_mistral_common import MistralCommonBackend

    return isinstance(tokenizer, MistralCommonBackend)


def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer renders chats: a Jinja chat template, or mistral-common's own rules."""
    return bool(getattr(tokenizer, "chat_template", None)) or is_mistral_tokenizer(tokenizer)


def chat_ids(tokenizer, messages: list[dict], *, add_generation_prompt: bool = True) -> list[int]:
    """The conversation's token ids, ready for the assistant's next turn when `add_generation_prompt`
    (mistral-common always ends a conversation that way and takes the flag as a no-op)."""
    return list(
        tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
    )
