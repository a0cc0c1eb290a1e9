"""A folder in Mistral's own layout (params.json, consolidated*.safetensors, tekken.json) written in
the Hugging Face layout: `rlvr import MISTRAL_DIR OUT`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from rlvr.models.checkpoint_files import CheckpointFiles
from rlvr.models.mistral_layout import TOKENIZER_FILE, TensorNames, hf_config


def import_mistral(source: str | Path, out: str | Path) -> Path:
    """Write the Mistral folder `source` in the Hugging Face layout: config.json (mistral4 /
    mistral, `quantization_config` with its ignore list under HF names), model.safetensors
    under transformers' on-disk names (experts one Linear each) as stored, tekken.json copied
    and, where transformers builds a tokenizer from it, that tokenizer saved too."""
    source, out = Path(source), Path(out)
    config = hf_config(source)
    quantization = getattr(config, "quantization_config", None)
    if quantization:
        names = TensorNames(config)
        meta = torch.empty(0, device="meta")
        config.quantization_config = {**quantization, "ignore": [
            m if m.startswith("re:") else names.to_hf(f"{m}.weight", meta)[0].removesuffix(".weight")
            for m in quantization.get("ignore", [])]}  # fmt: skip
    files = CheckpointFiles(source)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    save_file(
        {key: files.read(key).contiguous() for key in files.keys()},
        out / "model.safetensors",
        metadata={"format": "pt"},
    )
    if (source / TOKENIZER_FILE).is_file():
        (out / TOKENIZER_FILE).write_bytes((source / TOKENIZER_FILE).read_bytes())
        _save_hf_tokenizer(out / TOKENIZER_FILE, out)
    return out


def _save_hf_tokenizer(tekken_file: Path, out: Path) -> None:
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    convert_tekken_tokenizer(str(tekken_file)).save_pretrained(out)
