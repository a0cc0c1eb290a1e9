"""kill -9 (or SIGTERM) at a random moment, `rlvr train --resume latest`, and the run's metrics are the same
line for line as those of a run never interrupted (real vLLM, 2 FSDP2 ranks, LoRA on NVFP4), one step
off-policy or fully asynchronous: the rollout modes whose checkpoints must also restore what was in
flight. (A synchronous run resumes through the same restore, with nothing in flight.) The same for
trainer.backend megatron (tensor parallel 2), whose uninterrupted run also gives FSDP2's metrics.

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
from run_fixtures import (
    EVEN_ANSWERS_ONLY,
    TEST_ENGINE_THREADS,
    comparable_metrics,
    metric_differences,
    resume_training,
    start_training,
    verifier_file,
)

from rlvr.config import load_config
from rlvr.demo import ensure_demo_assets

STEPS = 3  # a checkpointed step, the step interrupted, and one that the resumed run starts afresh


# The seed stack's update: 4 mini-batches of whole groups a step, and DAPO's dynamic sampling
# refilling the step with informative groups (the data position moves by what each step drew,
# which the checkpoint must capture). The demo's one update a step is the case of 1 mini-batch.
CHANGES = {"trainer": {"mini_batches": 4}, "rollout": {"dynamic_sampling": True, "max_sampling_rounds": 3}}
# One step off-policy (rollout.max_staleness: 1): step t+1's rollouts are generated while step t
# trains, by the policy one version behind.
ONE_STEP_OFF = {"trainer": CHANGES["trainer"], "rollout": {**CHANGES["rollout"], "max_staleness": 1}}


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """(config(run_dir, checkpoint_every), the one-step-off reference run's metrics, root)."""
    return _setting(tmp_path_factory.mktemp("resume"), ONE_STEP_OFF)


def _setting(root, changes: dict, steps: int = STEPS, assets=None):
    assets = assets or root / "assets"
    cfg = yaml.safe_load(open("configs/demo.yaml"))
    cfg.update(steps=steps)
    cfg["model"]["path"] = str(assets / "model")
    cfg["data"].update(train=str(assets / "task/train.jsonl"), test=str(assets / "task/test.jsonl"))
    cfg["rollout"]["prompts_per_step"] = 4
    cfg["eval"].update(every=2, n=2, k=[1, 2], max_problems=4)
    cfg["demo"]["warm_start"].update(steps=0)
    cfg["demo"]["task"].update(train_size=64, test_size=8)
    # the untrained model answers nothing right: a reward by which about half the groups are
    # informative makes dynamic sampling refill every step, and every step train
    root.mkdir(parents=True, exist_ok=True)
    cfg["reward"]["verifier"] = verifier_file(root, EVEN_ANSWERS_ONLY)
    cfg["tracking"] = {"progress": False}
    cfg["engine"]["num_threads"] = TEST_ENGINE_THREADS
    cfg["model"]["dtype"] = "float32"  # the resumed run's metrics must equal the uninterrupted run's, line for line
    for section, values in changes.items():
        if section != "checkpoint":
            cfg[section].update(values)

    def config(run_dir, checkpoint_every=changes.get("checkpoint", {}).get("every", 1)):
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


# kill -9 at a random moment of a fully asynchronous run, K = 2, with the seed stack's update
# (CHANGES): the stream keeps 2 steps of groups in flight, pushes reach them mid-sequence, and a
# checkpoint (every 2 steps) drains it. Killed in step 3, the resumed run starts from step 2's
# drained stream and must sample, drop and train exactly what the reference did. (A synchronous
# run's exact resume is the SIGTERM test's.)
ASYNC_STEPS = 4
ASYNC = {
    "rollout": {**CHANGES["rollout"], "mode": "async", "max_staleness": 2},
    "trainer": CHANGES["trainer"],
    "checkpoint": {"every": 2},
}


@pytest.mark.slow
def test_an_async_run_killed_then_resumed_gives_the_uninterrupted_metrics(setting, tmp_path):
    config, expected, root = _setting(tmp_path, ASYNC, steps=ASYNC_STEPS, assets=setting[2] / "assets")
    steps = [row for row in expected if "reward/mean" in row]
    assert len(steps) == ASYNC_STEPS
    assert all(row["grad_norm"] > 0 for row in steps)  # every step trains: the resumed run must restore what it trained
    assert any(row["rollout/sampled_groups"] > row["rollout/informative_groups"] for row in steps)  # and refills
    # every step's staleness is logged and bounded, and some tokens were generated by an older policy
    assert all(0 <= row["rollout/staleness_max"] <= 2 for row in steps)
    assert max(row["rollout/staleness_max"] for row in steps) >= 1
    # each group drawn is trained, dropped or filtered once: the steps' ranges chain from 0
    assert [row["rollout/groups_from"] for row in steps] == [0] + [row["rollout/groups_to"] for row in steps[:-1]]
    run_dir = root / "killed"
    _kill_and_resume(config(run_dir), run_dir, kill_after=2, delay=random.Random(2).uniform(0.0, 2.0))
    metrics = comparable_metrics(run_dir)
    assert metrics == expected, metric_differences(metrics, expected)
    summary = json.loads((run_dir / "summary.json").read_text())
    reference = json.loads((root / "reference" / "summary.json").read_text())
    assert summary["eval_before"] == reference["eval_before"] and summary["eval_after"] == reference["eval_after"]


# The one-step-off run with Megatron's tensor parallel 2 in place of FSDP2's 2 shards: the same
# LoRA factors at the start, the same base (the NVFP4 checkpoint's values), the same losses
MEGATRON = {
    **ONE_STEP_OFF,
    "trainer": {**ONE_STEP_OFF["trainer"], "backend": "megatron", "megatron": {"tensor_parallel": 2}},
}


@pytest.mark.slow
def test_megatron_trains_the_run_as_fsdp2_does_and_resumes_after_kill(setting, tmp_path):
    """3 steps of trainer.backend megatron give FSDP2's metrics (loss, grad norm, sampler/trainer
    gap, rewards...) within float32 rounding; killed in step 2 and resumed, its metrics equal its
    uninterrupted run's line for line."""
    config, expected, root = _setting(tmp_path, MEGATRON, assets=setting[2] / "assets")
    fsdp2 = setting[1]
    assert [row.keys() for row in expected] == [row.keys() for row in fsdp2]
    # the same tokens sampled and scored, the same counts; the trainers' float figures (loss, grad
    # norm, sampler/trainer gap...) differ by float32 rounding: tensor parallel sums in another order
    for row, want in zip(expected, fsdp2):
        for key, value in want.items():
            close = pytest.approx(value, rel=1e-4, abs=1e-6) if isinstance(value, float) else value
            assert row[key] == close, (row.get("step"), key, row[key], value)
    assert all(row["grad_norm"] > 0 for row in expected if "reward/mean" in row)
    run_dir = root / "killed"
    _kill_and_resume(config(run_dir), run_dir, kill_after=1, delay=random.Random(1).uniform(0.0, 1.0))
    metrics = comparable_metrics(run_dir)
    assert metrics == expected, metric_differences(metrics, expected)


def _kill_and_resume(path, run_dir, kill_after: int, delay: float) -> None:
    """SIGKILL the run's process group `delay` s after its step `kill_after` is logged; resume it."""
    victim = start_training(path)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and victim.poll() is None:
        steps_done = (
            sum('"reward/mean"' in line for line in metrics.read_text().splitlines()) if metrics.exists() else 0
        )
        if steps_done >= kill_after:
            break
        time.sleep(0.2)
    time.sleep(delay)
    assert victim.poll() is None, "the run ended before it could be killed"
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)

    resumed = start_training(path, "--resume", "latest")  # the config again (the SIGTERM test resumes from the folder)
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out[-3000:]
    assert "resuming from" in out


@pytest.mark.slow
def test_one_step_off_rollouts_lag_one_version_and_sigterm_resumes_to_the_same_metrics(setting):
    """SIGTERM in step 2 of a one-step-off run: the step finishes, checkpoints (the next rollouts
    were already in flight: their adapter is saved with it) and exits 0; resumed, the in-flight
    rollouts are generated again by the same adapter from the same prompts and seed."""
    config, expected, root = setting
    rows = [row for row in expected if "reward/mean" in row]
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert row["grad_norm"] > 0 and row["skipped"] == 0 and 0 < row["policy/is_weight"] <= 2.0
        assert row["sync/logprob_gap"] <= 1e-3  # after each sync the engine serves the trainer's weights
    # Step 1 trains on rollouts of the initial policy, which is also the trainer's; from step 2 on
    # they come from the policy one update behind the trainer's, so the sampler's logprobs differ.
    assert rows[0]["sync/sampler_trainer_gap"] <= 1e-3
    assert all(row["sync/sampler_trainer_gap"] > 1e-3 for row in rows[1:])
    assert any(
        row["rollout/sampled_groups"] > row["rollout/informative_groups"] for row in rows
    )  # dynamic sampling refilled
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
    metrics = comparable_metrics(run_dir)
    assert metrics == expected, metric_differences(metrics, expected)
