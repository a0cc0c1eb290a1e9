"""Piped, every command's output keeps its lines whole: Rich lays out at 80 columns where it finds no
terminal, which broke summary lines and the plan's table in CI logs and under grep.

Each command runs as a real subprocess with stdout and stderr pipes and COLUMNS unset, on inputs that
make lines longer than 80 characters; what it prints must equal what it prints into a 100,000-column
terminal width (COLUMNS set), and hold such a line whole. The training run's own console
(rlvr.tracking.terminal.run_output) is checked in-process, on a pipe too.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.eval import SampleRow, write_samples
from rlvr.models.tiny import build_tiny_model
from rlvr.tracking.terminal import run_output

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DEEP = "a-folder-name-long-enough-that-every-path-under-it-passes-eighty-columns-on-its-own"


def rlvr(*args: str, columns: str | None = None) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns:
        env["COLUMNS"] = columns
    done = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )
    # libraries' tqdm bars (transformers saving a model) carry timings that differ run to run
    return done.returncode, "".join(
        line for line in (done.stdout + done.stderr).splitlines(keepends=True) if not re.search(r"it/s\]|s/it\]", line)
    )


def assert_whole(args: list[str], expected_code: int, longest_at_least: int = 81) -> str:
    code, piped = rlvr(*args)
    assert code == expected_code, piped[-3000:]
    _, wide = rlvr(*args, columns="100000")
    assert piped == wide, f"piped output differs from a 100,000-column terminal's:\n{piped[-3000:]}"
    assert max(map(len, piped.splitlines())) >= longest_at_least, piped
    return piped


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pipes") / DEEP
    folder.mkdir()
    return folder


def test_config_defaults():
    assert_whole(["config", "--defaults"], 0)


@pytest.mark.slow
def test_the_dry_run_plan_table():
    """The plan's table (one row per device) and its notes."""
    out = assert_whole(
        ["train", str(CONFIGS / "aime_mistral_large3_nvfp4_ray.yaml"), "--dry-run"], 0, longest_at_least=120
    )
    assert any(line.startswith("total") and line.count("│") == 2 for line in out.splitlines())


def test_eval_from_saved_samples_writes_and_says_where(deep):
    samples = write_samples(
        deep / "samples.jsonl",
        [SampleRow(problem_id="p", sample=0, response="1", extracted="1", reward=1.0, status="ok", answer="1")],
    )
    out = assert_whole(["eval", "--from-rollouts", str(samples), "--k", "1", "--out", str(deep / "metrics.json")], 0)
    assert f"wrote {deep / 'metrics.json'}" in out.splitlines()


def test_score_and_report(deep):
    rows = deep / "responses.jsonl"
    rows.write_text(json.dumps({"response": r"\boxed{2}", "answer": "2"}) + "\n")
    out = assert_whole(["score", str(rows), "-o", str(deep / "scored.jsonl"), "--workers", "1"], 0)
    assert any(line.startswith("scored 1 rows -> ") for line in out.splitlines())
    run = deep / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    assert f"report: {run / 'report.html'}" in assert_whole(["report", str(run)], 0).splitlines()


@pytest.mark.slow
def test_quantize(deep):
    model = build_tiny_model(
        deep / "tiny", "qwen2", hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128
    )
    out = assert_whole(["quantize", str(model), str(deep / "tiny-nvfp4"), "--format", "nvfp4"], 0)
    assert f"wrote {deep / 'tiny-nvfp4'} (nvfp4)" in out.splitlines()


def test_an_error_is_one_whole_line():
    assert len(assert_whole(["frobnicate-" + DEEP], 2).splitlines()) == 1


@pytest.mark.parametrize("verbose", [False, True])
def test_a_runs_console_on_a_pipe(tmp_path, capfd, verbose):
    """`rlvr train` and `rlvr demo` print through run_output's console (stdout a pipe or file here)."""
    line = "held-out avg@8: " + "x" * 200
    with run_output(tmp_path, verbose=verbose) as console:
        console.print(line, highlight=False)
    assert line in capfd.readouterr().out.splitlines()
