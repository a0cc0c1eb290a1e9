"""A model folder is read once, by what opens the run: the engine, the trainer ranks and the plan
take that record (rlvr.models.folder.ModelFolder), pickled into the ranks' processes, and read no
config file of the folder again."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from rlvr.config import load_config
from rlvr.engines import served_folder
from rlvr.engines.vllm_options import folder_options, moe_shape
from rlvr.models.folder import check_model_folder
from rlvr.models.tiny import build_tiny_mistral_folder, build_tiny_model
from rlvr.planning.plan import make_plan
from rlvr.planning.sections import PlanSections
from rlvr.quant.skeleton import Skeleton

SIZES = dict(hidden_size=64, num_heads=4, num_kv_heads=4, num_layers=3, intermediate_size=128)


@pytest.fixture(params=["qwen2", "deepseek_v3", "mistral_layout"])
def opened(request, tmp_path):
    """(the layout's name, the record the run's builders open)."""
    if request.param == "mistral_layout":
        path = build_tiny_mistral_folder(tmp_path / "model", kv_lora_rank=32, qk_rope_head_dim=16, **SIZES)
    else:
        path = build_tiny_model(tmp_path / "model", request.param, **SIZES)
    return request.param, check_model_folder(path)


@pytest.fixture
def config_reads(monkeypatch):
    """The config files (config.json, params.json) read through Path.read_text from now on."""
    reads = []
    read_text = Path.read_text

    def counted(self, *args, **kwargs):
        if self.name in ("config.json", "params.json"):
            reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    return reads


def test_a_rank_and_the_engine_build_from_the_record_without_reading_the_folder_again(opened, config_reads):
    layout, folder = opened
    sent = pickle.loads(pickle.dumps(folder))  # what a rank process or an engine's Ray actor receives
    skeleton = Skeleton.from_checkpoint(sent, torch.float32)  # the rank's model, on meta
    experts, moe_blocks = moe_shape(sent)  # what the vLLM engine asks before it starts vLLM
    options = folder_options(sent)
    assert served_folder(sent) is sent  # a float folder is served as it is
    assert config_reads == []
    assert skeleton.base_format == "hf"
    assert (experts > 0, bool(moe_blocks)) == ((layout != "qwen2",) * 2)
    assert (options.get("config_format") == "mistral") == (layout == "mistral_layout")


def test_the_plan_reads_the_record_it_is_given_not_the_folder(opened, config_reads):
    layout, folder = opened
    cfg = load_config(Path(__file__).parents[1] / "configs" / "demo.yaml", [f"model.path={folder.path}"])
    plan = make_plan(PlanSections.of(cfg, folder))
    assert config_reads == []
    assert plan.architecture is not None and plan.architecture.source == str(folder.config_file)
    assert (plan.architecture.mla is not None) == (layout != "qwen2")
