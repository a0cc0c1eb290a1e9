"""DAPO's dynamic sampling and overlong shaping, through the collector a run steps with: the real
vLLM engine (in-process) on a tiny random model, the real scoring pool with a reward file, the run's
seeded prompt order. (What a step then trains on is the trainer's; these are the step's rollouts.)"""

import pytest
from engine_fixtures import start_engine
from run_fixtures import EVEN_ANSWERS_ONLY, verifier_file

from rlvr.config import AlgorithmConfig, EnvConfig, RewardConfig, RolloutConfig, SandboxConfig
from rlvr.envs import EnvContext
from rlvr.models.tiny import build_tiny_model
from rlvr.records import Problem
from rlvr.rewards import ScoringPool
from rlvr.rollout.collect import RolloutCollector
from rlvr.rollout.prompts import PromptSet
from rlvr.rollout.sampler import EpochSampler
from rlvr.rollout.trajectories import TrajectoryRunner
from rlvr.tracking.timing import StepTimer

PROMPTS = 4  # prompts_per_step
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    # random weights: near-uniform next tokens, so a group's completions differ in length
    model = build_tiny_model(
        tmp_path_factory.mktemp("dynamic-sampling") / "model",
        "qwen2",
        seed=0,
        hidden_size=128,
        num_layers=2,
        intermediate_size=256,
    )
    env = EnvConfig()
    with start_engine("vllm", model, max_model_len=64, kv_cache_gb=0.1, in_process=True) as engine:
        yield TrajectoryRunner(engine, None, env, EnvContext(env, SandboxConfig()), max_model_len=64)


def _collect(runner, tmp_path, reward: str, steps: int, rounds: int, algorithm: AlgorithmConfig | None = None):
    """Each step's metrics from a collector on a 64-problem set (answers 0..63), and its log lines."""
    problems = [Problem(f"p{i}", f"{i}?", str(i)) for i in range(64)]
    prompts = [[3 + i % 7, 11 + i % 3, 4 + i % 5, 20 + i % 11] for i in range(64)]
    rollout = RolloutConfig(
        prompts_per_step=PROMPTS,
        samples_per_prompt=4,
        dynamic_sampling=True,
        max_sampling_rounds=rounds,
        sampling={"max_tokens": MAX_TOKENS},
    )
    lines: list[str] = []
    with ScoringPool(verifier_file(tmp_path, reward), workers=1) as pool:
        collector = RolloutCollector(
            rollout,
            algorithm or AlgorithmConfig(),
            RewardConfig(),
            runner,
            pool,
            PromptSet(problems, prompts),
            EpochSampler(len(problems), seed=0),
            seed=0,
            timer=StepTimer(),
            log=lines.append,
        )
        batches = [collector.collect(step) for step in range(1, steps + 1)]
    return batches, lines


@pytest.mark.slow
def test_dynamic_sampling_keeps_only_informative_groups_and_moves_the_data_position_by_what_it_drew(runner, tmp_path):
    shaping = AlgorithmConfig(overlong_filter=True, overlong_penalty={"buffer": 8, "max_penalty": 0.5})
    batches, lines = _collect(runner, tmp_path, EVEN_ANSWERS_ONLY, steps=3, rounds=8, algorithm=shaping)
    drawn = 0
    for rollouts in batches:
        m = rollouts.metrics
        assert m["rollout/informative_groups"] == PROMPTS  # every group trained differs in reward
        assert len(rollouts.batch.completion_ids) == PROMPTS * 4
        assert rollouts.data_position == drawn  # where the step began: what a checkpoint records
        drawn += m["rollout/sampled_groups"]
        assert m["data/position"] == drawn  # every prompt drawn is consumed, dropped or not
        assert 0.0 <= m["response/overlong_filtered_fraction"] <= 1.0 and "reward/verifier_mean" in m
        # the overlong filter zeroes the loss mask of cut-off completions, and only theirs
        mask = rollouts.batch.loss_mask or [[1] * len(c) for c in rollouts.batch.completion_ids]
        for row, completion in zip(mask, rollouts.batch.completion_ids, strict=True):
            assert all(row) or (len(completion) == MAX_TOKENS and not any(row))
    # odd answers' groups all score 0: they are dropped, and more prompts drawn
    assert any(rollouts.metrics["rollout/sampled_groups"] > PROMPTS for rollouts in batches)
    assert not lines


@pytest.mark.slow
def test_dynamic_sampling_says_in_one_line_when_it_cannot_fill_the_step(runner, tmp_path):
    (rollouts,), lines = _collect(
        runner, tmp_path, "def always_one(response, answer):\n    return 1.0\n", steps=1, rounds=2
    )
    assert rollouts.metrics["rollout/informative_groups"] == 0 and rollouts.metrics["rollout/sampling_rounds"] == 2
    assert lines == [
        f"step 1: dynamic sampling found 0 of {PROMPTS} informative groups in 2 rounds ({2 * PROMPTS} prompts "
        "drawn); training on one group of the last round (all advantages 0: no gradient); raise "
        "rollout.max_sampling_rounds for more"
    ]
    # the step still trains, on one group: with no KL term its gradient is 0 whatever it trains on
    assert len(rollouts.batch.completion_ids) == 4 and not rollouts.batch.advantages.any()
    # with a KL term, which has a gradient of its own, on all of the last round's groups
    kl = AlgorithmConfig(kl="k3", kl_coef=0.1)
    (rollouts,), lines = _collect(
        runner, tmp_path, "def always_one(response, answer):\n    return 1.0\n", steps=1, rounds=2, algorithm=kl
    )
    assert "training on the last round's groups (no gradient but the KL term's)" in lines[0]
    assert len(rollouts.batch.completion_ids) == PROMPTS * 4 and not rollouts.batch.advantages.any()
