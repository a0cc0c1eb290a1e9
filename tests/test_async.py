"""rollout.max_staleness: 1 on the real stack: the rollouts of step t+1 are generated while step t
trains, by the policy one version behind, and a run stopped and resumed in the middle gives
the same metrics as one never stopped (the rollouts in flight are generated again, by the same
adapter from the same prompts and seed). Full fine-tuning streams fully asynchronously too."""

import json

import pytest

from run_fixtures import (DIGIT_SHARE, comparable_metrics, small_config, start_training, step_rows,
                          stopped_after_step_one_then_resumed, train)

STEPS = 3


@pytest.mark.slow
def test_one_step_off_policy_rollouts_lag_one_version_and_resume_reproduces_them(tmp_path):
    def config(name, checkpoint_every):
        return small_config(tmp_path, name, STEPS, reward=DIGIT_SHARE, rollout={"max_staleness": 1},
                            checkpoint={"every": checkpoint_every, "keep": 2})

    reference = start_training(config("reference", 1))
    out, _ = reference.communicate(timeout=900)
    assert reference.returncode == 0, out[-3000:]
    rows = step_rows(tmp_path / "reference")
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert row["grad_norm"] > 0 and row["skipped"] == 0 and 0 < row["policy/is_weight"] <= 2.0
        assert row["sync/logprob_gap"] <= 1e-3  # after each sync the engine serves the trainer's weights
    # Step 1 trains on rollouts of the initial policy, which is also the trainer's; from step 2 on
    # they come from the policy one update behind the trainer's, so the sampler's logprobs differ.
    assert rows[0]["sync/sampler_trainer_gap"] <= 1e-3
    assert all(row["sync/sampler_trainer_gap"] > 1e-3 for row in rows[1:])

    # SIGTERM during step 2: it finishes, checkpoints (the next rollouts were already in flight), exits
    stopped_after_step_one_then_resumed(config("stopped", STEPS), tmp_path / "stopped")
    assert comparable_metrics(tmp_path / "stopped") == comparable_metrics(tmp_path / "reference")


def test_stale_rollouts_turn_truncated_importance_sampling_on_unless_set():
    from rlvr.config import load_config

    assert load_config("configs/demo.yaml").algorithm.tis_cap is None
    assert load_config("configs/demo.yaml", ["rollout.max_staleness=1"]).algorithm.tis_cap == 2.0
    assert load_config("configs/demo.yaml", ["rollout.max_staleness=1", "algorithm.tis_cap=5"]).algorithm.tis_cap == 5.0


@pytest.mark.slow
def test_full_fine_tuning_streams_fully_asynchronously(tmp_path):
    """trainer.lora: null with rollout.mode: async: each push is the whole model, as version t, taken
    by the samples in flight at the stream's next engine step; staleness stays within K, every
    group drawn is accounted for, and the engine computes the trainer's weights at the end."""
    path = small_config(tmp_path, "run", 3, reward=DIGIT_SHARE, trainer={"lora": None}, demo={"base_format": "hf"},
                        rollout={"mode": "async", "max_staleness": 2, "sampling": {"max_tokens": 24}})
    done = train(path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["lora_rank"] is None
    rows = step_rows(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["grad_norm"] > 0 and row["rollout/staleness_max"] <= 2 for row in rows)
    assert max(row["rollout/staleness_max"] for row in rows) >= 1  # generated ahead, under older weights
    assert [row["rollout/groups_from"] for row in rows] == [0] + [row["rollout/groups_to"] for row in rows[:-1]]
    assert rows[-1]["sync/logprob_gap"] <= 1e-3  # the probe of the last push, before the after-evaluation
