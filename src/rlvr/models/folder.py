"""A model folder read once into a `ModelFolder` record, and checked before anything starts.

`read_model_folder` answers what every component asks of a folder: its layout (Hugging Face or
Mistral's), its config, its weight files, its tokenizer files and the modalities its encoders
take. The components (checkpoint reading, the quantized skeleton, the engine and the run's
builders) take the record, or a path they read into one, so that a process reads a folder once
rather than once per question.

`check_model_folder` reads it with one line naming what is wrong. Without it, a missing folder
reaches the Hugging Face Hub client ("Repo id must use alphanumeric chars"), a GGUF file fails
deep in a loader, and a folder without a tokenizer fails in a trainer rank, each as a traceback.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rlvr.errors import UserError
from rlvr.models.mistral_layout import (
    PARAMS_FILE,
    TOKENIZER_FILE,
    WEIGHTS_PATTERN,
    config_from_params,
    is_mistral_folder,
    read_params,
    weight_files,
)
from rlvr.models.multimodal import modalities, positions_of

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


@dataclass(frozen=True, eq=False)
class ModelFolder:
    """What rlvr reads of a model folder, read once (`read_model_folder`)."""

    path: Path
    mistral: bool  # Mistral's layout (rlvr.models.mistral_layout), read as vLLM reads it
    config_file: Path  # config.json, or params.json in Mistral's layout: the file messages name
    config_dict: dict  # the config as config.json holds it (Mistral's: its transformers config's dict)
    stored_config: dict  # config.json as stored, else params.json: where a checkpoint names its encoders
    weight_files: tuple[Path, ...]  # the safetensors files rlvr reads (mistral_layout.weight_files)
    tokenizer_files: tuple[str, ...]  # those of TOKENIZER_FILES the folder holds
    modalities: tuple[str, ...]  # input modalities besides text (rlvr.models.multimodal)
    max_positions: int | None  # the longest sequence the engine accepts (multimodal.positions_of)
    params_config: Any = field(default=None, repr=False)  # Mistral's layout: its transformers config

    @property
    def quantization_config(self) -> dict | None:
        return self.config_dict.get("quantization_config")

    def transformers_config(self):
        """The transformers config (quantization_config included), a copy of its own to change."""
        return copy.deepcopy(self._config)

    @cached_property
    def _config(self):
        if self.params_config is not None:
            return self.params_config
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.path)


def read_model_folder(path: str | Path, where: str | None = None) -> ModelFolder:
    """The record of the model folder `path`, in the Hugging Face layout (config.json with a
    model_type transformers knows) or Mistral's (params.json that rlvr.models.mistral_layout
    reads); a ModelFolderError (a MistralLayoutError for params.json) in one line otherwise,
    naming `where` (default: the path)."""
    folder = Path(path)
    where = where or str(path)
    mistral = is_mistral_folder(folder)
    config_path = folder / "config.json"
    params_config = None
    if mistral:
        params = read_params(folder)
        params_config = config_from_params(params, str(folder / PARAMS_FILE))
        config_dict = params_config.to_dict()
        stored = _read_json(config_path) if config_path.is_file() else params
    elif not config_path.is_file():
        gguf = sorted(folder.glob("*.gguf"))
        hint = f"; it holds {gguf[0].name}: rlvr import {gguf[0]} OUT_DIR" if gguf else ""
        raise ModelFolderError(
            f"{where}: not a Hugging Face model folder (no config.json) nor one in Mistral's "
            f"layout (no {PARAMS_FILE} with {WEIGHTS_PATTERN}){hint}"
        )
    else:
        config_dict = stored = _read_json(config_path)
        _check_architecture(config_dict, config_path)
    return ModelFolder(
        path=folder,
        mistral=mistral,
        config_file=folder / PARAMS_FILE if mistral else config_path,
        config_dict=config_dict,
        stored_config=stored,
        weight_files=tuple(weight_files(folder, mistral=mistral)),
        tokenizer_files=tuple(name for name in TOKENIZER_FILES if (folder / name).is_file()),
        modalities=modalities(stored),
        max_positions=positions_of(stored, from_params=not config_path.is_file()),
        params_config=params_config,
    )


def as_model_folder(model: ModelFolder | str | Path) -> ModelFolder:
    """The record itself, or the folder at a path read into one."""
    return model if isinstance(model, ModelFolder) else read_model_folder(model)


def check_model_folder(path: str | Path, *, key: str = "model.path", need_tokenizer: bool = True) -> ModelFolder:
    """The record of `path`, or a ModelFolderError unless it is a model folder rlvr can build
    (`read_model_folder`) with readable safetensors weights and, if asked, tokenizer files
    (Mistral's tekken.json counts)."""
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
    model = read_model_folder(folder, where)
    _check_weights(model, where)
    if need_tokenizer and not model.tokenizer_files:
        raise ModelFolderError(
            f"{where}: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); rlvr needs the "
            "model's tokenizer to encode prompts: save it with tokenizer.save_pretrained(folder)"
        )
    return model


def _read_json(config_file: Path) -> dict:
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ModelFolderError(f"{config_file}: not valid JSON ({err.msg}, line {err.lineno})") from None


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


def _check_weights(model: ModelFolder, where: str) -> None:
    from safetensors import safe_open

    if not model.weight_files:
        if any(model.path.glob("pytorch_model*.bin")):
            raise ModelFolderError(
                f"{where}: weights in pytorch_model*.bin only; rlvr reads safetensors: load the model "
                "and save_pretrained it again (safe_serialization is the default)"
            )
        raise ModelFolderError(f"{where}: no weights (*.safetensors)")
    for file in model.weight_files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                weights.keys()
        except OSError:
            raise
        except Exception as err:  # safetensors raises its own error type for a damaged header
            raise ModelFolderError(f"{file}: unreadable safetensors file ({str(err).splitlines()[0]})") from None


def model_config(path: str | Path):
    """The transformers config of the folder at `path` in either layout, a Mistral folder read
    as vLLM reads it (for callers holding a path: `ModelFolder.transformers_config`)."""
    return read_model_folder(path).transformers_config()


def model_config_dict(path: str | Path) -> dict:
    """`model_config(path)` as the dict config.json holds (quantization_config included)."""
    return read_model_folder(path).config_dict


def config_file(path: str | Path) -> Path:
    """The file a folder's config comes from, params.json or config.json, without reading the
    folder: whether it exists says whether there is a folder to read."""
    return Path(path) / (PARAMS_FILE if is_mistral_folder(path) else "config.json")
