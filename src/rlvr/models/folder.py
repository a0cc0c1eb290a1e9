"""A model folder checked before anything starts: one line naming what is wrong with it.

Without this, a missing folder reaches the Hugging Face Hub client ("Repo id must use
alphanumeric chars"), a GGUF file fails deep in a loader, and a folder without a tokenizer
fails in a trainer rank, each as a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.errors import UserError
from rlvr.models.mistral_layout import (
    PARAMS_FILE,
    TOKENIZER_FILE,
    WEIGHTS_PATTERN,
    hf_config,
    is_mistral_folder,
    weight_files,
)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "spiece.model",
    TOKENIZER_FILE,
)


class ModelFolderError(UserError, ValueError):
    pass


def check_model_folder(path: str | Path, *, key: str = "model.path", need_tokenizer: bool = True) -> None:
    """Raise ModelFolderError unless `path` is a model folder rlvr can build, in the Hugging Face
    layout (config.json with a model_type transformers knows) or Mistral's (params.json that
    rlvr.models.mistral_layout reads), with readable safetensors weights and, if asked,
    tokenizer files (Mistral's tekken.json counts)."""
    folder = Path(path)
    where = f"{key}={path}"
    if not folder.exists():
        raise ModelFolderError(f"{where}: no such file or folder")
    if folder.is_file():
        if folder.suffix.lower() == ".gguf":
            raise ModelFolderError(
                f"{where}: a GGUF file, not a model folder; convert it first: rlvr import {path} OUT_DIR"
            )
        raise ModelFolderError(f"{where}: a file, not a Hugging Face model folder")
    config_file = folder / "config.json"
    if is_mistral_folder(folder):
        hf_config(folder)  # one line naming params.json where rlvr cannot read it
    elif not config_file.is_file():
        gguf = sorted(folder.glob("*.gguf"))
        hint = f"; it holds {gguf[0].name}: rlvr import {gguf[0]} OUT_DIR" if gguf else ""
        raise ModelFolderError(
            f"{where}: not a Hugging Face model folder (no config.json) nor one in Mistral's "
            f"layout (no {PARAMS_FILE} with {WEIGHTS_PATTERN}){hint}"
        )
    else:
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as err:
            raise ModelFolderError(f"{config_file}: not valid JSON ({err.msg}, line {err.lineno})") from None
        _check_architecture(config, config_file)
    _check_weights(folder, where)
    if need_tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(
            f"{where}: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); rlvr needs the "
            "model's tokenizer to encode prompts: save it with tokenizer.save_pretrained(folder)"
        )


def _check_architecture(config: dict, config_file: Path) -> None:
    import transformers
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not model_type:
        raise ModelFolderError(f"{config_file}: no model_type; transformers cannot tell which architecture it is")
    if model_type not in CONFIG_MAPPING:
        raise ModelFolderError(
            f"{config_file}: model_type {model_type!r} is not an architecture transformers "
            f"{transformers.__version__} knows (models that need trust_remote_code are not supported)"
        )


def _check_weights(folder: Path, where: str) -> None:
    from safetensors import safe_open

    files = weight_files(folder)
    if not files:
        if any(folder.glob("pytorch_model*.bin")):
            raise ModelFolderError(
                f"{where}: weights in pytorch_model*.bin only; rlvr reads safetensors: load the model "
                "and save_pretrained it again (safe_serialization is the default)"
            )
        raise ModelFolderError(f"{where}: no weights (*.safetensors)")
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                weights.keys()
        except OSError:
            raise
        except Exception as err:  # safetensors raises its own error type for a damaged header
            raise ModelFolderError(f"{file}: unreadable safetensors file ({str(err).splitlines()[0]})") from None


def model_config(path: str | Path):
    """The transformers config of a model folder in either layout: every reader of a model's
    config goes through here, so that a Mistral folder is read as vLLM reads it."""
    if is_mistral_folder(path):
        return hf_config(path)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def model_config_dict(path: str | Path) -> dict:
    """`model_config(path)` as the dict config.json holds (quantization_config included), read
    without transformers for a Hugging Face folder."""
    if is_mistral_folder(path):
        return hf_config(path).to_dict()
    return json.loads((Path(path) / "config.json").read_text())


def config_file(path: str | Path) -> Path:
    """The file a folder's config comes from, for messages: params.json or config.json."""
    return Path(path) / (PARAMS_FILE if is_mistral_folder(path) else "config.json")
