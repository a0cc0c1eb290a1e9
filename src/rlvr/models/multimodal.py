"""Multimodal checkpoints run text-only: which tensors are the encoders', what the text model is,
and what the engine is told so that it builds no encoder.

RL against verifiable rewards on text trains and serves the language model alone. A vision (or
audio) checkpoint carries it next to its encoders, in one of two layouts:

- Hugging Face (`Mistral3ForConditionalGeneration`, `LlavaForConditionalGeneration`, ...):
  config.json has `text_config` next to `vision_config` (or `audio_config`); the language model's
  tensors are `language_model.model.*` + `language_model.lm_head.*` (transformers < 4.52 names,
  which transformers 5 still writes) or `model.language_model.*` + `lm_head.*`; the encoders'
  are `vision_tower.*` and `multi_modal_projector.*` (with or without `model.`).
- Mistral's (params.json): the text model's fields at the top, the encoder's under
  `vision_encoder` or `multimodal.vision_encoder_args` (audio: `multimodal.whisper_model_args`),
  as vLLM's `adapt_config_dict` reads them; encoder tensors `vision_encoder.*`,
  `vision_language_adapter.*`, `patch_merger.*`, `pre_mm_projector_norm.*` (vLLM's pixtral.py).

The trainer builds the causal LM of the text config and reads only the language model's tensors,
under that model's own names (`text_tensor_name`). The engine gets `limit_mm_per_prompt` 0 for
every modality the model has: vLLM 0.32 then builds the encoder and projector on the meta device
as placeholders (`SupportsMultiModal._mark_tower_model`) and skips their weights, so the engine
holds the text weights only, as the trainer does.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

# config.json section -> the vLLM modalities its encoder takes (Qwen-VL towers take video too)
HF_ENCODER_CONFIGS = {"vision_config": ("image", "video"), "audio_config": ("audio",)}
HF_ENCODER_PREFIXES = ("vision_tower.", "multi_modal_projector.", "audio_tower.")
MISTRAL_ENCODER_PREFIXES = (
    "vision_encoder.",
    "vision_language_adapter.",
    "patch_merger.",
    "pre_mm_projector_norm.",
    "whisper_encoder.",
    "audio_language_adapter.",
)
# language-model prefixes of a multimodal HF checkpoint -> the text causal LM's own names
HF_TEXT_PREFIXES = {
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "model.language_model.": "model.",
}


def read_model_config(model_dir: str | Path) -> dict:
    """config.json, else Mistral's params.json, as a dict (empty when the folder has neither)."""
    for name in ("config.json", "params.json"):
        path = Path(model_dir) / name
        if path.is_file():
            return json.loads(path.read_text())
    return {}


def modalities(config: dict) -> tuple[str, ...]:
    """The input modalities besides text that a checkpoint's config (config.json or params.json) carries."""
    found: list[str] = [m for key, names in HF_ENCODER_CONFIGS.items() if config.get(key) for m in names]
    multimodal = config.get("multimodal") or {}
    if config.get("vision_encoder") or multimodal.get("vision_encoder_args"):
        found.append("image")
    if multimodal.get("whisper_model_args"):
        found.append("audio")
    return tuple(dict.fromkeys(found))


def is_multimodal(config: dict) -> bool:
    return bool(modalities(config))


def text_config(config: dict) -> dict:
    """The language model's fields: config.json's `text_config`, else the config itself (a text
    model's config.json, or params.json, whose text fields sit at the top)."""
    return config.get("text_config") or config


# the length keys vLLM 0.32 reads from a text config; it takes the smallest one present
# (`ModelArchConfigConvertorBase.derive_max_model_len_and_key`)
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# what vLLM's `adapt_config_dict` puts in a params.json that names no length
MISTRAL_DEFAULT_POSITIONS = 128_000


def max_positions(model_dir: str | Path) -> int | None:
    """`positions_of` the folder's config (config.json, else params.json)."""
    return positions_of(read_model_config(model_dir), from_params=not (Path(model_dir) / "config.json").is_file())


def positions_of(config: dict, *, from_params: bool) -> int | None:
    """The longest sequence the engine accepts for the language model, as vLLM derives it: the
    smallest length key of the text config (params.json: 128,000 when it names none); None when
    a config.json names none."""
    text = text_config(config)
    lengths = [text[key] for key in LENGTH_KEYS if isinstance(text.get(key), int)]
    if from_params and config:
        lengths = lengths or [MISTRAL_DEFAULT_POSITIONS]
    return min(lengths, default=None)


def is_encoder_tensor(name: str) -> bool:
    """A tensor of an encoder or of its projection into the language model, in either layout."""
    bare = name.removeprefix("model.")
    return bare.startswith(HF_ENCODER_PREFIXES) or name.startswith(MISTRAL_ENCODER_PREFIXES)


def text_tensor_name(name: str) -> str | None:
    """The name of a multimodal HF checkpoint's tensor in the text causal LM, None for an encoder's."""
    if is_encoder_tensor(name):
        return None
    for prefix, own in HF_TEXT_PREFIXES.items():
        if name.startswith(prefix):
            return own + name.removeprefix(prefix)
    return name


def text_model_names(config: dict):
    """name on disk -> its name in the text causal LM (None: an encoder's, not read), for the
    checkpoint whose config (config.json or params.json) is `config`; a text model's names are its own."""
    return text_tensor_name if is_multimodal(config) else (lambda name: name)


def encoder_weight_bytes(model_dir: str | Path) -> tuple[int, int]:
    """(tensors, bytes) of the encoders' weights in the folder's safetensors files, from their
    headers' data offsets (nothing else is read)."""
    import struct

    count = size = 0
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with file.open("rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, entry in header.items():
            if name != "__metadata__" and is_encoder_tensor(name):
                count, size = count + 1, size + entry["data_offsets"][1] - entry["data_offsets"][0]
    return count, size


def engine_options(config: dict) -> dict:
    """vLLM engine arguments for a text-only run: no item of any modality per prompt, so no encoder built."""
    found = modalities(config)
    return {"limit_mm_per_prompt": dict.fromkeys(found, 0)} if found else {}


def text_model_config(config):
    """The transformers config the trainer builds: a multimodal config's text config (its causal LM),
    its output head tied as the whole model's was (transformers ties by the outer config's
    tie_word_embeddings, False where it has none, and leaves a tied head out of the files)."""
    if not is_multimodal(config.to_dict()):
        return config
    text = copy.deepcopy(config.get_text_config())
    text.tie_word_embeddings = getattr(config, "tie_word_embeddings", False)
    return text
