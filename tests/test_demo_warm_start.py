"""The tools demo's warm start, reduced (2-digit x 1-digit products, 400 train rows), under the demo's
own stopping rule: it trains until the model copies operands into its calculator calls and results
into its box and its base accuracy lies in the window, then writes what it reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from rlvr.config import load_config
from rlvr.demo import ensure_demo_assets

TOOLS_DEMO = str(Path(__file__).resolve().parents[1] / "configs" / "demo_tools.yaml")


@pytest.mark.slow
def test_the_tools_warm_start_stops_once_the_model_copies_and_its_base_is_in_the_window(tmp_path):
    cfg = load_config(TOOLS_DEMO, [
        f"model.path={tmp_path}/model", f"data.train={tmp_path}/task/train.jsonl", f"data.test={tmp_path}/task/test.jsonl",
        "demo.task.min_digits=2", "demo.task.max_digits=2", "demo.task.second_operand_digits=1",
        "demo.task.train_size=400", "demo.task.test_size=20", "demo.warm_start.examples=400",
        "demo.warm_start.check.rows=32",
    ])
    record = ensure_demo_assets(cfg, Console(quiet=True))

    low, high = cfg.demo.warm_start.check.base_window
    check = cfg.demo.warm_start.check
    assert record["ready"], record["attempts"]
    skills = record["skills"]
    assert low <= skills["accuracy"] <= high
    assert skills["operand_copy"] >= check.min_operand_copy and skills["result_copy"] >= check.min_result_copy
    assert skills["format"] >= check.min_format and skills["samples"] == 32 * check.samples
    # it stopped on the check, not on the budget: the step it stopped at is its last check's
    last = record["attempts"][-1]["checks"][-1]
    assert last["step"] == record["steps"] < cfg.demo.warm_start.steps and last["phase"] == "mix"
    # copying first: the calling answers alone, then the mix from which RL starts
    assert {c["phase"] for c in record["attempts"][-1]["checks"]} == {"copy", "mix"}
    # the record beside the model is what `rlvr demo` puts in summary.json, and a second build reuses it
    assert json.loads((tmp_path / "model.warm_start.json").read_text()) == record
    assert ensure_demo_assets(cfg, Console(quiet=True)) == record
    assert (tmp_path / "model" / "config.json").is_file() and not list(tmp_path.glob("model.building*"))


@pytest.mark.slow
def test_a_warm_start_that_never_gets_ready_tries_new_seeds_then_goes_on_from_the_closest(tmp_path):
    from io import StringIO

    cfg = load_config(str(Path(TOOLS_DEMO).with_name("demo.yaml")), [
        f"model.path={tmp_path}/model", f"data.train={tmp_path}/task/train.jsonl", f"data.test={tmp_path}/task/test.jsonl",
        "demo.task.train_size=64", "demo.task.test_size=4", "demo.model.num_layers=1", "demo.base_format=hf",
        "demo.warm_start.steps=20", "demo.warm_start.check.every=10", "demo.warm_start.check.rows=4",
        "demo.warm_start.check.samples=1", "demo.warm_start.check.attempts=2",
        "demo.warm_start.check.base_window=[0.99,1.0]",  # out of reach of 20 steps
    ])
    out = StringIO()
    record = ensure_demo_assets(cfg, Console(file=out, width=300))

    assert record["ready"] is False
    assert [a["seed"] for a in record["attempts"]] == [0, 1000]
    assert [[c["step"] for c in a["checks"]] for a in record["attempts"]] == [[10, 20], [10, 20]]
    assert record["seed"] in (0, 1000) and record["steps"] == 20
    assert "warning: no warm start was ready in 2 attempts" in out.getvalue()
    assert (tmp_path / "model" / "config.json").is_file() and not list(tmp_path.glob("model.*attempt*"))
