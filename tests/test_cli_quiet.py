"""Every command prints its own lines and nothing else: piped, `rlvr eval` and `rlvr quantize` show
their result in a few lines on stdout, nothing on stderr, and name the log file where vLLM,
transformers and torch wrote (`--verbose` shows those logs instead)."""

import json
import subprocess
import sys

import pytest
from run_fixtures import TEST_ENGINE_THREADS


def rlvr(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlvr.cli", *map(str, args)], capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_commands_piped_print_their_result_alone(tmp_path):
    from rlvr.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "m", "qwen2", hidden_size=128, num_layers=2, intermediate_size=256)
    packed = tmp_path / "nvfp4"
    done = rlvr("quantize", model, packed, "--format", "nvfp4")
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == f"wrote {packed} (nvfp4)" and len(done.stdout.splitlines()) <= 2

    out = tmp_path / "gsm8k.json"
    args = ["eval", model, "--dataset", "gsm8k", "--limit", "2", "--n", "2", "--k", "1,2", "--max-tokens", "8",
            "--threads", TEST_ENGINE_THREADS, "--out", out]  # fmt: skip
    done = rlvr(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert done.stderr == "" and len(lines) <= 5, done.stdout + done.stderr
    assert lines[0].startswith("avg@2 ") and lines[0].endswith("(2 problems x 2)"), lines
    log = tmp_path / "gsm8k.log"
    assert lines[1] == f"samples: {out.with_suffix('.samples.jsonl')}  log: {log}" and lines[2] == f"wrote {out}"
    assert "vLLM" in log.read_text() or "vllm" in log.read_text()  # the engine's own lines went there

    again = rlvr("eval", "--from-rollouts", out.with_suffix(".samples.jsonl"), "--k", "1,2", "--json")
    assert again.returncode == 0 and again.stderr == "" and len(again.stdout.splitlines()) == 1, again.stdout
    rescored, result = json.loads(again.stdout), json.loads(out.read_text())
    assert {k: rescored[k] for k in ("avg@2", "pass@2", "maj@2")} == {
        k: result[k] for k in ("avg@2", "pass@2", "maj@2")
    }
