"""kill -9 (or SIGTERM) at a random moment, `rlvr train --resume latest`, and the run's metrics are the same
line for line as those of a run never interrupted (real vLLM, 2 FSDP2 ranks, LoRA on NVFP4).

The kill goes to the whole process group (controller, trainer ranks, scoring workers), as
when a node dies. Conditions for bit-identity: the same machine and thread count, seeded
sampling (each step's seed is derived from the run seed and the step), float32.
"""

import json
import os
import random
import signal
import time

import pytest
import yaml
from rich.console import Console
from run_fixtures import comparable_metrics, resume_training, start_training

from rlvr.config import load_config
from rlvr.demo import ensure_demo_assets

STEPS = 3  # a checkpointed step, the step interrupted, and one that the resumed run starts afresh


# The seed stack's update: 4 mini-batches of whole groups a step, and DAPO's dynamic sampling
# refilling the step with informative groups (the data position moves by what each step drew,
# which the checkpoint must capture). The demo's one update a step is the case of 1 mini-batch.
CHANGES = {"trainer": {"mini_batches": 4}, "rollout": {"dynamic_sampling": True, "max_sampling_rounds": 3}}


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """(config(run_dir, checkpoint_every), the reference run's metrics, root)."""
    return _setting(tmp_path_factory.mktemp("resume"), CHANGES)


def _setting(root, changes: dict):
    cfg = yaml.safe_load(open("configs/demo.yaml"))
    cfg.update(steps=STEPS)
    cfg["model"]["path"] = str(root / "assets" / "model")
    cfg["data"].update(train=str(root / "assets/task/train.jsonl"), test=str(root / "assets/task/test.jsonl"))
    cfg["rollout"]["prompts_per_step"] = 4
    cfg["eval"].update(every=2, n=2, k=[1, 2], max_problems=4)
    cfg["demo"]["warm_start"].update(steps=20, check=None)  # a fixed, unchecked warm start: the test is about the pipeline
    cfg["demo"]["task"].update(train_size=64, test_size=8)
    cfg["tracking"] = {"progress": False}
    for section, values in changes.items():
        cfg[section].update(values)

    def config(run_dir, checkpoint_every=1):
        path = root / f"{run_dir.name}.yaml"
        checkpoint = {"every": checkpoint_every, "keep": 2}
        path.write_text(yaml.safe_dump(cfg | {"run_dir": str(run_dir), "checkpoint": checkpoint}))
        return path

    reference = root / "reference"
    ensure_demo_assets(load_config(config(reference)), Console(quiet=True))
    done = start_training(config(reference))
    out, _ = done.communicate(timeout=900)
    assert done.returncode == 0, out[-3000:]
    return config, comparable_metrics(reference), root


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_metrics(setting):
    config, expected, root = setting
    rng = random.Random(1)  # kills after step 1, 2.3 s into step 2
    run_dir = root / "killed"
    path = config(run_dir)
    # kill after the first checkpoint exists, at a random step and a random moment within it
    kill_after = rng.randint(1, STEPS - 1)
    victim = start_training(path)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and victim.poll() is None:
        steps_done = sum('"reward/mean"' in line for line in metrics.read_text().splitlines()) if metrics.exists() else 0
        if steps_done >= kill_after:
            break
        time.sleep(0.2)
    time.sleep(rng.uniform(0.0, 4.0))
    assert victim.poll() is None, "the run ended before it could be killed"
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)

    resumed = start_training(path, "--resume", "latest")  # the config again (the SIGTERM test resumes from the folder)
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out[-3000:]
    assert "resuming from" in out
    assert comparable_metrics(run_dir) == expected
    summary = json.loads((run_dir / "summary.json").read_text())
    reference = json.loads((root / "reference" / "summary.json").read_text())
    assert summary["eval_before"] == reference["eval_before"] and summary["eval_after"] == reference["eval_after"]


@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_exits_0_and_resumes_to_the_same_metrics(setting):
    config, expected, root = setting
    run_dir = root / "terminated"
    path = config(run_dir, checkpoint_every=STEPS)  # the stop must write its own checkpoint
    victim = start_training(path)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and victim.poll() is None:
        if metrics.exists() and '"reward/mean"' in metrics.read_text():
            break
        time.sleep(0.2)
    os.kill(victim.pid, signal.SIGTERM)  # the controller only, as a scheduler's preemption notice
    out, _ = victim.communicate(timeout=300)
    assert victim.returncode == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    stopped = summary["stopped_after_step"]
    assert 1 <= stopped < STEPS and f"SIGTERM: stopped after step {stopped}" in out
    assert (run_dir / "checkpoints" / f"step_{stopped:06d}" / "manifest.json").is_file()

    resumed = resume_training(run_dir)  # the run folder alone (its own config.yaml), the other form
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out[-3000:]
    assert comparable_metrics(run_dir) == expected
