"""DAPO's dynamic sampling and overlong shaping in a real run (vLLM, an FSDP2 rank, LoRA on NVFP4)."""

import json

import pytest
from run_fixtures import EVEN_ANSWERS_ONLY, small_config, step_rows, train


@pytest.mark.slow
def test_dynamic_sampling_trains_only_informative_groups_and_moves_the_data_position_by_what_it_drew(tmp_path):
    config = small_config(
        tmp_path, "run", 3, reward=EVEN_ANSWERS_ONLY,
        rollout={"dynamic_sampling": True, "max_sampling_rounds": 8},
        algorithm={"overlong_filter": True, "overlong_penalty": {"buffer": 8, "max_penalty": 0.5}},
    )
    done = train(config)
    assert done.returncode == 0, done.stdout[-3000:]
    steps = step_rows(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2, 3]
    drawn = 0
    for s in steps:
        assert s["rollout/informative_groups"] == 4  # prompts_per_step, every one informative
        assert s["rollout/sampled_groups"] >= 4 and s["rollout/sampling_rounds"] >= 1
        drawn += s["rollout/sampled_groups"]
        assert s["data/position"] == drawn  # every prompt drawn is consumed, dropped or not
        assert 0.0 <= s["response/overlong_filtered_fraction"] <= 1.0 and "reward/verifier_mean" in s
    assert any(s["rollout/sampled_groups"] > 4 for s in steps)  # half the groups are dropped: it refilled
    assert "dynamic sampling found" not in done.stdout


@pytest.mark.slow
def test_dynamic_sampling_says_in_one_line_when_it_cannot_fill_the_step(tmp_path):
    config = small_config(tmp_path, "run", 1, reward="def always_one(response, answer):\n    return 1.0\n",
                          rollout={"dynamic_sampling": True, "max_sampling_rounds": 2})
    done = train(config)
    assert done.returncode == 0, done.stdout[-3000:]
    (step,) = step_rows(tmp_path / "run")
    assert step["rollout/informative_groups"] == 0 and step["rollout/sampling_rounds"] == 2
    line = "step 1: dynamic sampling found 0 of 4 informative groups in 2 rounds"
    assert line in done.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 1
