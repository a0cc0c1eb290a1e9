"""The tools demo's warm start under its own stopping rule, reduced to the mechanism: it trains on
the calling answers alone until the copy checks pass, then on the mix until the whole check
passes, stops at that check and writes what it reached. Whether the full-size demo gets there,
and in how many steps, is `benchmarks/demo_seeds.py`'s measurement (docs/benchmarks.md): training
a tiny model until it copies takes minutes, too long for a test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from rlvr.config import load_config
from rlvr.demo import ensure_demo_assets

TOOLS_DEMO = str(Path(__file__).resolve().parents[1] / "configs" / "demo_tools.yaml")


@pytest.mark.slow
def test_the_tools_warm_start_copies_first_then_mixes_and_stops_at_the_check_that_passes(tmp_path):
    # a one-block model, checks every 10 steps, and a check any model passes: the copy phase ends
    # at its first check and the mix at the next one
    cfg = load_config(
        TOOLS_DEMO,
        [
            f"model.path={tmp_path}/model",
            f"data.train={tmp_path}/task/train.jsonl",
            f"data.test={tmp_path}/task/test.jsonl",
            "demo.task.train_size=64",
            "demo.task.test_size=4",
            "demo.model.num_layers=1",
            "demo.warm_start.examples=56",
            "demo.warm_start.check.every=10",
            "demo.warm_start.check.rows=4",
            "demo.warm_start.check.samples=1",
            "demo.warm_start.check.base_window=[0.0,1.0]",
            "demo.warm_start.check.min_format=0",
            "demo.warm_start.check.min_operand_copy=0",
            "demo.warm_start.check.min_result_copy=0",
        ],
    )
    record = ensure_demo_assets(cfg, Console(quiet=True))

    assert record["ready"] and len(record["attempts"]) == 1, record["attempts"]
    assert record["skills"]["samples"] == 4
    # copying first: the calling answers alone, then the mix from which RL starts; it stopped on
    # the mix's first check, not on the budget
    checks = record["attempts"][0]["checks"]
    assert [(c["step"], c["phase"]) for c in checks] == [(10, "copy"), (20, "mix")]
    assert record["steps"] == 20 < cfg.demo.warm_start.steps
    # the record beside the model is what `rlvr demo` puts in summary.json, and a second build reuses it
    assert json.loads((tmp_path / "model.warm_start.json").read_text()) == record
    assert ensure_demo_assets(cfg, Console(quiet=True)) == record
    assert (tmp_path / "model" / "config.json").is_file() and not list(tmp_path.glob("model.building*"))


@pytest.mark.slow
def test_a_warm_start_that_never_gets_ready_tries_new_seeds_then_goes_on_from_the_closest(tmp_path):
    from io import StringIO

    cfg = load_config(
        str(Path(TOOLS_DEMO).with_name("demo.yaml")),
        [
            f"model.path={tmp_path}/model",
            f"data.train={tmp_path}/task/train.jsonl",
            f"data.test={tmp_path}/task/test.jsonl",
            "demo.task.train_size=64",
            "demo.task.test_size=4",
            "demo.model.num_layers=1",
            "demo.base_format=hf",
            "demo.warm_start.steps=20",
            "demo.warm_start.check.every=10",
            "demo.warm_start.check.rows=4",
            "demo.warm_start.check.samples=1",
            "demo.warm_start.check.attempts=2",
            "demo.warm_start.check.base_window=[0.99,1.0]",  # out of reach of 20 steps
        ],
    )
    out = StringIO()
    record = ensure_demo_assets(cfg, Console(file=out, width=300))

    assert record["ready"] is False
    assert [a["seed"] for a in record["attempts"]] == [0, 1000]
    assert [[c["step"] for c in a["checks"]] for a in record["attempts"]] == [[10, 20], [10, 20]]
    assert record["seed"] in (0, 1000) and record["steps"] == 20
    assert "warning: no warm start was ready in 2 attempts" in out.getvalue()
    assert (tmp_path / "model" / "config.json").is_file() and not list(tmp_path.glob("model.*attempt*"))
