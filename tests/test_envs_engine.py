"""Multi-turn trajectories through the real engine: every sampled token where it was sampled
(its sampler logprob is what the model gives it in place), every observation token masked; and
skyrl-gym's environments, unchanged, in RL runs."""

import json

import pytest
import torch
from engine_fixtures import start_engine
from run_fixtures import (
    comparable_metrics,
    metric_differences,
    small_config,
    step_rows,
    stopped_after_step_one_then_resumed,
    train,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.config import DataConfig, EnvConfig, SandboxConfig
from rlvr.envs import EnvContext, make_env
from rlvr.models.tiny import build_tiny_model
from rlvr.records import Problem, Sampling
from rlvr.rollout.prompts import Renderer
from rlvr.rollout.trajectories import Start, TrajectoryRunner

# A random model never emits its end of turn: these end its turns within ~15 tokens (a turn cut
# at max_tokens ends its trajectory, as a truncated answer does).
STOP = tuple("abcdefghijklmnopqrst")
GSM8K_ROW = Problem(id="g", question="Tom has 3 apples and buys 4 more. How many now?", answer="7")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", "qwen2", hidden_size=128, num_layers=2, intermediate_size=256
    )


@pytest.mark.slow
@pytest.mark.parametrize("lockstep", [False, True])
def test_multi_turn_trajectories_keep_sampled_tokens_in_place_and_mask_observations(tiny, lockstep):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = EnvConfig(name="skyrl:gsm8k_multi_turn", max_turns=3, lockstep=lockstep)
    renderer = Renderer(tokenizer, DataConfig(train="-"))
    with start_engine("vllm", tiny, max_model_len=512, kv_cache_gb=0.5) as engine:
        runner = TrajectoryRunner(engine, renderer, config, EnvContext(config, SandboxConfig()), max_model_len=512)
        starts = [Start(GSM8K_ROW, renderer.prompt(GSM8K_ROW)), Start(GSM8K_ROW, renderer.prompt(GSM8K_ROW))]
        trajectories = runner.run(starts, 3, Sampling(temperature=1.0, max_tokens=64, stop=STOP, seed=5))
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    assert len(trajectories) == 6
    for t in trajectories:
        assert t.turns == 3  # a random model never answers "#### 7": the environment asks again
        assert len(t.completion_ids) == len(t.mask) == len(t.logprobs)
        assert t.mask[0] == 1 and 0 in t.mask  # starts with a sampled turn; observations in between
        sequence = torch.tensor([t.prompt_ids + t.completion_ids])
        with torch.no_grad():
            logits = model(sequence).logits[0, len(t.prompt_ids) - 1 : -1].float()
        logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(t.completion_ids)[:, None])[:, 0]
        sampled = torch.tensor(t.mask).bool()
        # every sampled token, in its place in the trajectory, has the logprob the sampler gave it
        assert (logprobs[sampled] - torch.tensor(t.logprobs)[sampled]).abs().max() < 1e-3
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.mask) if not m)
        assert t.reward is not None  # skyrl's per-turn rewards, summed


@pytest.mark.slow
def test_skyrl_python_tool_runs_in_rlvrs_sandbox():
    """skyrl-gym's searchcode environment (search + python) with its Python tool pointed at the sandbox:
    the model's code cannot see this machine's files, and errors come back in the tool's words."""
    config = EnvConfig(name="skyrl:searchcode", max_turns=3)
    env = make_env(config.name, GSM8K_ROW, EnvContext(config, SandboxConfig()))
    env.reset(GSM8K_ROW)
    step = env.step("<tool><python>print(3 + 4)</python></tool>")
    assert (step.done, step.tool_calls, step.tool_errors) == (False, 1, 0) and "7" in step.observation[0]["content"]
    step = env.step("<tool><python>print(open('/etc/hostname').read())</python></tool>")
    assert step.tool_errors == 1 and "Error executing Python code" in step.observation[0]["content"]
    assert env.step("<solution>#### 7</solution>").done


@pytest.mark.slow
def test_a_skyrl_environment_streams_fully_asynchronously_and_resumes_exactly(tmp_path):
    """rollout.mode: async with skyrl-gym's searchcode (its Python tool pointed at the run's sandbox;
    it asks again until it gets an answer) through the loop, which reaches every skyrl-gym
    environment through the one adapter: groups of several turns, the later ones sampled by newer
    policies, staleness within K, every group drawn accounted for; stopped by SIGTERM after step 1
    and resumed, the run's metrics equal an uninterrupted one's line for line. (Both checkpoint
    every step: a checkpoint drains the stream and probes the push, and the stopped run checkpoints
    where it stops.) gsm8k_multi_turn's turns through the real engine are checked token by token above."""

    def config(name):
        return small_config(
            tmp_path,
            name,
            3,
            env={"name": "skyrl:searchcode", "max_turns": 2},
            rollout={"mode": "async", "max_staleness": 2, "sampling": {"max_tokens": 24, "stop": list(STOP)}},
            checkpoint={"every": 1, "keep": 1},
            # the untrained model never answers: DAPO's length penalty gives each group rewards that differ
            algorithm={"overlong_penalty": {"buffer": 20}},
            # the tool's limit in CPU time, which load does not change; a wall-clock limit a loaded
            # machine could reach would answer one run's call with a timeout and not the other's
            sandbox={"wall_s": 60, "cpu_s": 5},
        )

    reference = train(config("reference"))
    assert reference.returncode == 0, reference.stdout[-3000:]
    rows = step_rows(tmp_path / "reference")
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["env/turns_mean"] > 1 and row["grad_norm"] > 0 for row in rows)
    assert all(row["rollout/staleness_max"] <= 2 for row in rows) and rows[-1]["rollout/staleness_max"] >= 1
    assert [row["rollout/groups_from"] for row in rows] == [0] + [row["rollout/groups_to"] for row in rows[:-1]]
    assert (
        rows[0]["sync/sampler_trainer_gap"] <= 1e-3
    )  # step 1 is on-policy: the trainer scored the sampled tokens in place
    assert rows[-1]["sync/logprob_gap"] <= 1e-3  # the probe, on the push the after-evaluation uses
    after = [json.loads(line) for line in (tmp_path / "reference" / "eval" / "after.jsonl").read_text().splitlines()]
    assert after and any(row["turns"] and row["turns"] > 1 for row in after)  # transcripts of several turns

    stopped_after_step_one_then_resumed(config("stopped"), tmp_path / "stopped")
    stopped, reference = comparable_metrics(tmp_path / "stopped"), comparable_metrics(tmp_path / "reference")
    assert stopped == reference, metric_differences(stopped, reference)
