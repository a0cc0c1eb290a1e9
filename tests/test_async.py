"""Rollouts generated ahead of training: truncated importance sampling turns on with them, and full
fine-tuning streams fully asynchronously on the real stack. (One step off-policy on the real
stack, and its exact resume: tests/test_resume_after_kill.py.)"""

import json

import pytest
from run_fixtures import DIGIT_SHARE, small_config, step_rows, train


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
    path = small_config(
        tmp_path,
        "run",
        3,
        reward=DIGIT_SHARE,
        trainer={"lora": None},
        demo={"base_format": "hf"},
        rollout={"mode": "async", "max_staleness": 2, "sampling": {"max_tokens": 24}},
    )
    done = train(path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["lora_rank"] is None
    rows = step_rows(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["grad_norm"] > 0 and row["rollout/staleness_max"] <= 2 for row in rows)
    assert max(row["rollout/staleness_max"] for row in rows) >= 1  # generated ahead, under older weights
    assert [row["rollout/groups_from"] for row in rows] == [0] + [row["rollout/groups_to"] for row in rows[:-1]]
    assert rows[-1]["sync/logprob_gap"] <= 1e-3  # the probe of the last push, before the after-evaluation
