"""The demo's asset builder writes its task only where data.train and data.test name files."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from rlvr.config import load_config
from rlvr.demo import ensure_demo_assets
from rlvr.models.tiny import build_tiny_model


def test_a_named_data_source_is_used_as_it_is_and_no_file_takes_its_name(tmp_path, monkeypatch):
    model = build_tiny_model(tmp_path / "model", "qwen2", hidden_size=32, num_layers=1, intermediate_size=64)
    monkeypatch.chdir(tmp_path)
    task = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&max_digits=1"
    cfg = load_config(
        _demo_yaml(), [f"model.path={model}", f"data.train={task}&size=16&seed=0", f"data.test={task}&size=2&seed=16"]
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    ensure_demo_assets(cfg, Console(quiet=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_missing_task_files_are_written(tmp_path):
    model = build_tiny_model(tmp_path / "model", "qwen2", hidden_size=32, num_layers=1, intermediate_size=64)
    cfg = load_config(
        _demo_yaml(),
        [f"model.path={model}", f"data.train={tmp_path}/task/train.jsonl", f"data.test={tmp_path}/task/test.jsonl"],
    )
    ensure_demo_assets(cfg, Console(quiet=True))
    assert (tmp_path / "task" / "train.jsonl").is_file() and (tmp_path / "task" / "test.jsonl").is_file()


def _demo_yaml() -> str:
    return str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
