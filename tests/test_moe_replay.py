"""Routing replay (R3) end to end on a tiny DeepSeek-V3: the transformers engine records each
position's expert choice while it samples, the rollouts carry them to the trainer ranks, and
with `trainer.routing_replay` the trainer scores the sampled tokens under those experts.

The engine here routes differently from the trainer on purpose: its copy of the model has its
routers' `e_score_correction_bias` moved. DeepSeek-V3 picks experts by score + bias but weighs
the picked ones by the score alone, so the engine chooses other experts for many tokens while
every number it computes with is the trainer's: a stand-in for a sampler whose kernels break
near-ties another way. Without replay the trainer's logprobs then miss the engine's; with it
they match, and the moe/ metrics say both.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from engine_fixtures import rank_spec
from transformers import AutoModelForCausalLM

from rlvr.config import EngineConfig
from rlvr.engines.hf_engine import HFEngine
from rlvr.models.folder import read_model_folder
from rlvr.models.moe import moe_layers
from rlvr.models.routing import record_routing
from rlvr.models.tiny import build_tiny_model
from rlvr.records import Sampling, TrainBatch
from rlvr.training.trainer import Trainer, TrainerError

SIZES = dict(hidden_size=64, num_heads=4, num_kv_heads=4, num_layers=3, intermediate_size=128)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
BIAS_SCALE = 0.05  # the routers' sigmoid scores lie in (0, 1): this moves some choices, not all


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("deepseek_v3"), "deepseek_v3", **SIZES)


def _engine(path) -> HFEngine:
    return HFEngine(read_model_folder(path), EngineConfig(backend="hf", num_threads=1), dtype="float32", seed=0)


def test_the_hf_engine_returns_each_positions_experts_as_a_forward_over_the_rollout_chooses_them(model_dir):
    engine = _engine(model_dir)
    rollouts = engine.generate(PROMPTS, 2, Sampling(max_tokens=8, seed=1))  # left padding: prompts differ in length
    layers = moe_layers(engine.model)
    for rollout in rollouts:
        sequence = rollout.prompt_ids + rollout.completion_ids
        assert rollout.routes.dtype == torch.uint8  # 8 experts: a byte per choice
        assert rollout.routes.shape == (len(sequence) - 1, len(layers), layers[0].top_k)  # the last token is never fed
        with torch.no_grad(), record_routing(engine.model) as record:
            engine.model(torch.tensor([sequence[:-1]]))
        assert torch.equal(rollout.routes.long(), record.stacked())


def _biased_copy(model_dir, tmp_path):
    """The model with its routers' choice bias moved (gate weights unchanged)."""
    path = tmp_path / "engine_model"
    shutil.copytree(model_dir, path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in moe_layers(model):
            bias = layer.router.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape, generator=generator) * BIAS_SCALE)
    model.save_pretrained(path)
    return path


@pytest.mark.slow
def test_replayed_routes_make_the_trainers_logprobs_the_engines(model_dir, tmp_path):
    rollouts = _engine(_biased_copy(model_dir, tmp_path)).generate(PROMPTS, 2, Sampling(max_tokens=8, seed=1))
    batch = TrainBatch(
        prompt_ids=[r.prompt_ids for r in rollouts],
        completion_ids=[r.completion_ids for r in rollouts],
        sampler_logprobs=[r.logprobs for r in rollouts],
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
        group=torch.tensor([0, 0, 1, 1]),
        routes=[r.routes for r in rollouts],
    )
    lora = {"rank": 4, "alpha": 8.0}
    metrics = {}
    for replay in (False, True):
        with Trainer(rank_spec(model_dir, ranks=1, lora=lora, lr=1e-6, routing_replay=replay)) as trainer:
            metrics[replay] = trainer.train_step(batch)
    for replay, m in metrics.items():
        assert 0.3 < m["moe/routing_agreement"] < 1.0  # the moved bias changes some choices, not all
        assert m["moe/sampler_trainer_gap_replay"] <= 1e-5  # replayed: the engine's own logprobs
        assert m["moe/sampler_trainer_gap_no_replay"] > 5e-3  # the trainer's own routes: other experts
        gap = m["moe/sampler_trainer_gap_replay" if replay else "moe/sampler_trainer_gap_no_replay"]
        assert m["sync/sampler_trainer_gap"] == pytest.approx(gap)  # the loss's π_old is the configured one
        assert 1.0 <= m["moe/expert_load_max_over_mean"] <= 8 / 2
        assert m["moe/expert_load_max_over_mean"] == max(m[f"moe/expert_load_max_over_mean/layer{i}"] for i in (0, 1))
    assert metrics[False]["moe/routing_agreement"] == metrics[True]["moe/routing_agreement"]  # measured before replay


@pytest.mark.slow
def test_routing_replay_on_a_dense_model_or_without_routes_is_one_line(model_dir, tmp_path):
    dense = build_tiny_model(tmp_path / "dense", "qwen2", hidden_size=64, num_layers=1, intermediate_size=128)
    with pytest.raises(TrainerError, match=r"trainer.routing_replay: .* has no mixture-of-experts layers to replay"):
        Trainer(rank_spec(dense, routing_replay=True)).wait_started()
    batch = TrainBatch([[5, 6, 7]], [[8, 9]], [[-1.0, -1.0]], torch.tensor([1.0]), torch.tensor([0]))
    with Trainer(rank_spec(model_dir, routing_replay=True, lora={"rank": 4})) as trainer:
        with pytest.raises(TrainerError, match=r"trainer.routing_replay: the engine returned no routes"):
            trainer.train_step(batch)


def test_vllm_routed_experts_become_rollout_routes_of_the_moe_blocks(model_dir):
    """vLLM's `routed_experts` (GPU only, not run here) have a row per decoder block, dense blocks
    included, and one per position the request ran; a rollout keeps the MoE blocks' rows."""
    from types import SimpleNamespace

    import numpy as np

    from rlvr.engines.inflight import Preempted
    from rlvr.engines.vllm_options import moe_shape
    from rlvr.engines.vllm_replies import RolloutReader
    from rlvr.records import Request

    experts_per_layer, moe_blocks = moe_shape(read_model_folder(model_dir))
    assert moe_blocks == [1, 2] and experts_per_layer == 8  # layer 0 is dense
    reader = RolloutReader(lambda ids: "", moe_blocks, experts_per_layer)  # as a GPU engine reads its outputs
    prompt, completion = [5, 6, 7], [8, 9]
    experts = np.arange(4 * 3 * 2).reshape(4, 3, 2).astype(np.uint8)  # [positions, 3 blocks, top-2]
    sample = SimpleNamespace(
        index=0,
        finish_reason="stop",
        token_ids=completion,
        text="",
        routed_experts=experts,
        logprobs=SimpleNamespace(token_ids=completion, logprobs=[-1.0, -1.0]),
    )
    output = SimpleNamespace(request_id="r", outputs=[sample])
    (rollout,) = reader.rollouts(Request(0, prompt, 1, Sampling()), output, Preempted(), 0)  # no update in flight
    assert rollout.routes.dtype == torch.uint8
    assert torch.equal(rollout.routes.long(), torch.from_numpy(experts[:, 1:].astype(np.int64)))


def test_a_multi_turn_trajectory_keeps_each_turns_new_positions_routes():
    """Turn 2's request is the trajectory so far (prompt, turn 1, observation): its routes repeat
    turn 1's positions, and the trajectory takes from it only the positions turn 1 did not run."""
    from rlvr.records import Rollout
    from rlvr.rollout.trajectories import Trajectory

    prompt, first, observation, second = [1, 2, 3], [4, 5], [6, 7], [8, 9, 10]
    turn1 = torch.full((len(prompt) + len(first) - 1, 2, 2), 1, dtype=torch.uint8)
    turn2 = torch.full((len(prompt + first + observation) + len(second) - 1, 2, 2), 2, dtype=torch.uint8)
    trajectory = Trajectory(0, prompt)
    trajectory.add_turn(Rollout(0, prompt, first, [-1.0] * 2, "stop", "", routes=turn1))
    trajectory.completion_ids += observation
    trajectory.add_turn(Rollout(0, prompt + first + observation, second, [-1.0] * 3, "stop", "", routes=turn2))
    assert trajectory.routes.shape[0] == len(prompt + first + observation + second) - 1
    assert trajectory.routes[:, 0, 0].tolist() == [1] * 4 + [2] * 5  # turn 1's own, then what turn 2 ran anew
