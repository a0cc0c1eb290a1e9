"""A small real run for the controller, Day-0 and placement tests (imported, not a conftest): the
demo's stack (vLLM, FSDP2, LoRA on an NVFP4 base) on a tiny task, configured in one place."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from safetensors.torch import load_file

from rlvr.config import load_config
from rlvr.demo import ensure_demo_assets

# One engine thread in the tests' runs. `make test` runs two files at once on the machine's
# cores, and vLLM's OpenMP threads wait for each other at every op: where the other file's
# processes hold one of a 2-thread engine's cores, each op waits out their time slice. The
# one-step-off reference run of test_resume_after_kill beside a 2-core load: 182 s with the
# demo's 2 engine threads, 75 s with 1 (generation 58 s -> 6 s in its first step).
TEST_ENGINE_THREADS = 1

# A reward that varies between samples even for an untrained model, so every step's adapter moves.
DIGIT_SHARE = """
def digit_share(response, answer):
    return sum(c.isdigit() for c in response) / max(1, len(response))
"""


# Groups of odd-answer problems all score 0 (uninformative); even-answer groups score by the
# parity of each response's length, so nearly all of them are informative: dynamic sampling
# refills every step, and every step trains.
EVEN_ANSWERS_ONLY = """
def even_answers_only(response, answer):
    return float(int(answer) % 2 == 0 and len(response) % 2 == 0)
"""


def verifier_file(root: Path, source: str) -> str:
    """`reward.verifier` for a reward function's source, written to ROOT/reward.py."""
    (root / "reward.py").write_text(source)
    return f"{root / 'reward.py'}:{source.split('def ')[1].split('(')[0]}"


def small_config(root: Path, name: str, steps: int, reward: str | dict | None = None, **sections) -> Path:
    """Write ROOT/NAME.yaml: the demo config, shrunk, with its run in ROOT/NAME and the assets
    (built on first use) in ROOT/assets; `sections` update the config's sections key by key,
    nested sections too (`demo={"model": {"arch": "llama"}}` keeps the model's other sizes).
    One trainer rank, not the demo's 2: on 2 cores a second rank process beside vLLM costs each run
    seconds, and only the tests about sharding or placement ask for `trainer={"ranks": 2}`.
    `reward`: a reward function's source (the run scores with it), or reward section keys."""
    cfg = yaml.safe_load(open("configs/demo.yaml"))
    assets = root / "assets"
    cfg.update(run_dir=str(root / name), steps=steps)
    cfg["model"]["path"] = str(assets / "model")
    cfg["data"].update(train=str(assets / "task/train.jsonl"), test=str(assets / "task/test.jsonl"))
    cfg["rollout"].update(prompts_per_step=4, samples_per_prompt=4)
    cfg["eval"].update(n=2, k=[1, 2], max_problems=2)
    cfg["demo"]["warm_start"].update(steps=0)
    cfg["demo"]["task"].update(train_size=32, test_size=4)
    cfg["trainer"]["ranks"] = 1
    cfg["engine"]["num_threads"] = TEST_ENGINE_THREADS
    # float32, not the default auto: these runs check equalities to float32 rounding (a resumed run's
    # metrics line for line, the engine's logprobs against the trainer's within 1e-3)
    cfg["model"]["dtype"] = "float32"
    cfg["tracking"] = {"progress": False}
    if isinstance(reward, dict):
        sections["reward"] = reward
    elif reward is not None:
        cfg["reward"]["verifier"] = verifier_file(root, reward)
    _merge(cfg, sections)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ensure_demo_assets(load_config(path), Console(quiet=True))
    return path


def _merge(into: dict, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def start_training(config: Path, *extra: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlvr.cli", "train", str(config), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **popen,
    )


def resume_training(run_dir: Path) -> subprocess.Popen:
    """`rlvr train --resume RUN_DIR`: the run continued from its own config.yaml."""
    return subprocess.Popen(
        [sys.executable, "-m", "rlvr.cli", "train", "--resume", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def train(config: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`rlvr train CONFIG` to its end (in `env`); stdout and stderr together in `.stdout`."""
    run = start_training(config, env=env)
    out, _ = run.communicate(timeout=900)
    return subprocess.CompletedProcess(run.args, run.returncode, out)


def stopped_after_step_one_then_resumed(config: Path, run_dir: Path) -> None:
    """Start a run, send it SIGTERM once step 1 is logged (it finishes its step, checkpoints and
    exits 0), then `--resume latest` it to the end."""
    victim = start_training(config)
    deadline = time.time() + 600
    while time.time() < deadline and victim.poll() is None and not step_rows(run_dir):
        time.sleep(0.2)
    os.kill(victim.pid, signal.SIGTERM)
    out, _ = victim.communicate(timeout=300)
    assert victim.returncode == 0 and "stopped after step" in out, out[-3000:]
    resumed = start_training(config, "--resume", "latest")
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out[-3000:]


def comparable_metrics(run_dir: Path) -> list[dict]:
    """Every line of metrics.jsonl with every value but the timings: what reruns must reproduce."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))} for row in rows]


def metric_differences(got: list[dict], expected: list[dict]) -> str:
    """Where two runs' comparable metrics part, line by line and key by key: the message for an
    assert that they are equal (pytest's own diff stops at the first line and is cut short)."""
    if len(got) != len(expected):
        return f"{len(got)} metric lines, expected {len(expected)}"
    return "; ".join(
        f"line {i} (step {row.get('step')}) {key}: {row.get(key)!r} != {want.get(key)!r}"
        for i, (row, want) in enumerate(zip(got, expected))
        for key in sorted(row.keys() | want.keys())
        if row.get(key) != want.get(key)
    )


def step_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's per-step lines (those of an RL step, not the eval-only ones)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [row for row in rows if "reward/mean" in row]


def two_rl_steps(
    root: Path, arch: str, base_format: str, backend: str = "vllm", **trainer
) -> subprocess.CompletedProcess:
    """2 RL steps of a tiny random `arch` (2 layers) on a `base_format` base, rollouts from `backend`,
    trained by 2 FSDP2 ranks; `trainer` are trainer section keys."""
    config = small_config(
        root,
        "run",
        2,
        reward=DIGIT_SHARE,
        engine={"backend": backend},
        trainer={"ranks": 2, **trainer},
        demo={"base_format": base_format, "model": {"arch": arch, "num_layers": 2, "intermediate_size": 256}},
    )
    return train(config)


def check_two_trained_steps(root: Path, arch: str, base_format: str, engine: str) -> None:
    """`two_rl_steps` ran what it was asked, both steps trained, and sampler and trainer agreed."""
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert (summary["engine"], summary["trainer_ranks"], summary["lora_rank"], summary["base_format"]) == (
        engine,
        2,
        16,
        base_format,
    )
    assert json.loads((root / "assets" / "model" / "config.json").read_text())["model_type"] == arch
    steps = step_rows(root / "run")
    assert [line["step"] for line in steps] == [1, 2]
    moe = "moe/routing_agreement" in steps[0]
    for line in steps:
        assert line["reward/std"] > 0 and line["grad_norm"] > 0  # the adapter gets a real update
        assert (
            line["sync/sampler_trainer_gap"] <= 1e-3
        )  # the rollouts' own logprobs: the last push, on every trained token
        assert ("moe/routing_agreement" in line) == moe  # every step of an MoE model, none of a dense one
        if moe:  # the engine and the trainer compute in float32 alike: they route alike too
            assert line["moe/routing_agreement"] > 0.99
            assert line["moe/sampler_trainer_gap_replay"] <= 1e-3 and line["moe/sampler_trainer_gap_no_replay"] <= 1e-3
            assert line["moe/expert_load_max_over_mean"] >= 1.0
    assert "sync/logprob_gap" not in steps[0]  # step 2's sampler gap checks step 1's push: no probe
    assert steps[-1]["sync/logprob_gap"] <= 1e-3  # the probe, on the push the after-evaluation uses
    adapter = load_file(next((root / "run").glob("checkpoints/*/adapter/adapter_model.safetensors")))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and max(float(t.abs().max()) for t in lora_b) > 0  # B starts at zero: it trained
