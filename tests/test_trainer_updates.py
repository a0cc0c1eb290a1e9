"""A step's updates: mini-batches of whole groups, epochs, pi_old, loss masks and the KL reference,
on real FSDP2 ranks over gloo (a tiny model, LoRA)."""

from dataclasses import replace

import pytest
import torch
from engine_fixtures import grpo_train_batch, rank_spec

from rlvr.models.tiny import build_tiny_model
from rlvr.training.packing import split_by_group
from rlvr.training.trainer import Trainer

LORA = dict(rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")


def test_mini_batches_hold_whole_groups_in_order():
    group = [3, 3, 7, 7, 1, 1, 9, 9, 5, 5]
    assert split_by_group(group, 1) == [list(range(10))]
    assert split_by_group(group, 2) == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]
    assert split_by_group(group, 5) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert split_by_group(group, 9) == split_by_group(group, 5)  # never more mini-batches than groups
    interleaved = [0, 1, 0, 1, 2, 2]
    assert split_by_group(interleaved, 2) == [[0, 1, 2, 3], [4, 5]]  # groups 0 and 1, then 2
    for count in range(1, 5):
        parts = split_by_group(interleaved, count)
        assert sorted(i for part in parts for i in part) == list(range(6))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(
        build_tiny_model(
            tmp_path_factory.mktemp("m") / "tiny", "qwen2", hidden_size=64, num_layers=2, intermediate_size=128
        )
    )


@pytest.mark.slow
def test_four_mini_batches_take_four_updates_from_one_pi_old_and_clip_acts(tiny):
    batch = grpo_train_batch(groups=8)
    with Trainer(rank_spec(tiny, lr=5e-2, lora=LORA)) as trainer:
        single = trainer.train_step(batch)
    with Trainer(rank_spec(tiny, lr=5e-2, lora=LORA, mini_batches=4)) as trainer:
        four = trainer.train_step(batch)
    assert (single["optimizer/steps"], four["optimizer/steps"]) == (1, 4)
    assert single["policy/clip_fraction"] == 0.0  # one update: the ratio is 1 at its only loss
    assert four["policy/clip_fraction"] > 0.0  # later updates see a moved policy
    assert four["policy/approx_kl"] > 0.0  # k3(pi_old, pi after the 4 updates)
    # pi_old is the policy before any update: the sampler gap is measured against it in both
    assert four["sync/sampler_trainer_gap"] == pytest.approx(single["sync/sampler_trainer_gap"], rel=1e-5)
    assert four["lr"] == single["lr"]  # the schedule counts RL steps


@pytest.mark.slow
def test_mini_batches_and_epochs_agree_on_one_and_two_ranks(tiny):
    batch = grpo_train_batch(groups=6, seed=1)
    results = {}
    for ranks in (1, 2):
        with Trainer(
            rank_spec(tiny, lr=2e-2, lora=LORA, ranks=ranks, mini_batches=3, epochs=2, micro_batch_tokens=40)
        ) as t:
            metrics = t.train_step(batch)
            results[ranks] = (metrics, t.adapter().tensors)
    (m1, a1), (m2, a2) = results[1], results[2]
    assert m1["optimizer/steps"] == m2["optimizer/steps"] == 6
    for key in ("loss", "grad_norm", "policy/clip_fraction", "policy/approx_kl"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-4, abs=1e-7), key
    # six Adam updates amplify float noise in the smallest gradients: agree to 1e-4 of ~0.1-sized weights
    assert max((a1[k] - a2[k]).abs().max().item() for k in a1) < 1e-4


@pytest.mark.slow
def test_a_masked_response_trains_as_if_it_were_not_there(tiny):
    batch = grpo_train_batch(groups=3, seed=2)
    dropped = 5
    masked = replace(batch, loss_mask=[[int(i != dropped)] * len(c) for i, c in enumerate(batch.completion_ids)])
    keep = [i for i in range(len(batch)) if i != dropped]
    without = replace(
        batch,
        prompt_ids=[batch.prompt_ids[i] for i in keep],
        completion_ids=[batch.completion_ids[i] for i in keep],
        sampler_logprobs=[batch.sampler_logprobs[i] for i in keep],
        advantages=batch.advantages[keep],
        group=batch.group[keep],
    )
    adapters = []
    for b in (masked, without):
        with Trainer(rank_spec(tiny, lr=2e-2, lora=LORA)) as trainer:
            trainer.train_step(b)
            adapters.append(trainer.adapter().tensors)
    # Adam's first step is ~lr * sign(g): a response that trained would move weights by ~2e-2; float
    # noise in the packing (the masked response still runs in the forward) moves them by ~1e-6
    assert max((adapters[0][k] - adapters[1][k]).abs().max().item() for k in adapters[0]) < 1e-4


@pytest.mark.slow
def test_the_kl_reference_is_the_base_with_the_adapter_disabled(tiny):
    batch = grpo_train_batch(groups=2, seed=3)
    with Trainer(rank_spec(tiny, lr=5e-2, lora=LORA, algorithm={"kl": "k3", "kl_coef": 0.1})) as trainer:
        first = trainer.train_step(batch)
        second = trainer.train_step(batch)
    assert first["policy/kl"] == 0.0  # LoRA's B starts at zero: the policy is the reference
    assert second["policy/kl"] > 0.0
    assert torch.isfinite(torch.tensor(second["loss"]))
