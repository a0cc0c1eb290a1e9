"""GGUF files (llama.cpp's format) imported as float HF model folders.

`import_gguf(source, out)` reads the file's header with the `gguf` package, then loads it through
transformers' GGUF loader (`from_pretrained(..., gguf_file=)`, every weight dequantized by
`GgufConfig(dequantize=True)`, whatever kernels are installed) and writes what an HF folder holds:
config.json, generation_config.json, model.safetensors and the tokenizer files with the chat
template the file carries. The folder is written beside `out` and renamed into place when
complete, so an interrupted import leaves no half folder. Its logits are transformers' own load
of the file, bit for bit in the same dtype.

Inputs that are not a GGUF file fail with one line naming the path and what it is instead.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from rlvr.models.transformers_classes import causal_lm_from_pretrained

GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16", "float16")


def is_gguf_file(path: str | Path) -> bool:
    """Whether `path` is a file that starts with GGUF's magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def _check_source(source: Path) -> None:
    """One-line ValueError unless `source` is a GGUF file (rules in the module doc)."""
    if not source.exists():
        raise ValueError(f"{source}: no such file")
    if source.is_dir():
        if (source / "config.json").is_file():
            raise ValueError(f"{source} is already an HF model folder: use it as model.path, no import needed")
        raise ValueError(
            f"{source}: neither an HF model folder nor a GGUF file, nor a folder in Mistral's layout "
            "(no config.json, no params.json with consolidated*.safetensors)"
        )
    if not is_gguf_file(source):
        hint = "; give the folder that holds it" if source.suffix in (".safetensors", ".bin", ".json") else ""
        raise ValueError(f"{source}: not a GGUF file (it does not start with the bytes 'GGUF'){hint}")


def gguf_architecture(source: str | Path) -> str:
    """The file's `general.architecture` (e.g. 'llama'), read with the `gguf` package."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(source).fields.get("general.architecture")
    except Exception as err:  # a truncated or corrupt file fails in numpy, struct or gguf alike
        raise ValueError(f"{source}: not a readable GGUF file ({type(err).__name__}: {err})") from None
    if field is None:
        raise ValueError(f"{source}: the GGUF header has no general.architecture")
    return str(field.contents())


def import_gguf(source: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Write the GGUF file `source` as a float HF model folder `out` (see the module doc)."""
    source, out = Path(source), Path(out)
    _check_source(source)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: already exists and is not an empty folder; choose a new output folder")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError("reading GGUF files needs the gguf package: pip install 'rlvr[gguf]'")
    architecture = gguf_architecture(source)

    import torch
    from transformers import AutoTokenizer, GgufConfig

    folder, name = str(source.parent.resolve()), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, OSError) as err:
        raise ValueError(f"{source}: no tokenizer could be read from the file ({_first_line(err)})") from None
    try:
        model = causal_lm_from_pretrained(
            folder, gguf_file=name, dtype=getattr(torch, dtype), quantization_config=GgufConfig(dequantize=True)
        )
    except (ValueError, KeyError, OSError) as err:
        raise ValueError(
            f"{source}: transformers cannot load this {architecture!r} GGUF as a causal LM ({_first_line(err)})"
        ) from None

    partial = out.with_name(f".{out.name}.importing")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    if out.exists():
        out.rmdir()  # empty, checked above
    partial.rename(out)
    return out


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
