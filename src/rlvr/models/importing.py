"""`rlvr import SOURCE OUT`: a GGUF file or a folder in Mistral's layout, written as a Hugging Face
model folder (rlvr.models.gguf_import, rlvr.models.mistral_import)."""

from __future__ import annotations

from pathlib import Path

from rlvr.models.gguf_import import import_gguf
from rlvr.models.mistral_import import import_mistral, quantized_experts_note
from rlvr.models.mistral_layout import is_mistral_folder


def import_model(source: Path, out: Path, dtype: str = "float32") -> tuple[Path, str | None]:
    """The folder written, and a note on what transformers alone cannot load of it (None: all of it).
    `dtype` is the weights' dtype in OUT for a GGUF file; a Mistral folder keeps its own."""
    if is_mistral_folder(source):
        return import_mistral(source, out), quantized_experts_note(source, out)
    return import_gguf(source, out, dtype=dtype), None
