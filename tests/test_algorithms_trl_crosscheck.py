"""rlvr's losses against TRL's own GRPOTrainer loss code, run on the same tensors.

TRL computes its loss inside `GRPOTrainer._compute_loss(self, model, inputs)`. The trainer is
not built (no model, no accelerate): the unbound method runs against a namespace holding only
the attributes it reads, and its model forward is replaced by a function returning our fixed
logprobs. What runs is TRL's code as installed, so a change of formula upstream shows here.
The TRL version is the one pinned by the dev extra (trl 1.16 when written).
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer
from trl.trainer.utils import entropy_from_logits as trl_entropy_from_logits
from trl.trainer.utils import selective_log_softmax

from rlvr.algorithms import aggregate, entropy_from_logits, kl_penalty, overlong_penalty, policy_loss, token_logprobs

B, T, MAX_COMPLETION_LENGTH = 6, 7, 9
EPS_LOW, EPS_HIGH = 0.2, 0.28
# SAPO temperatures far apart (not the paper's 1.0 / 1.05), so that swapping them would show.
TAU_POS, TAU_NEG = 0.7, 1.6


def batch():
    gen = torch.Generator().manual_seed(1234)
    old = -2.0 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    logprobs = old + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)  # ratios 0.3..3: clipping happens
    ref = old + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    advantages = torch.randn(B, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([7, 5, 1, 3, 6, 2])
    mask = (torch.arange(T) < lengths[:, None]).to(torch.float64)
    return logprobs, old, ref, advantages, mask


def trl_loss(loss_type, *, level="token", beta=0.0, epsilon_high=EPS_HIGH):
    """TRL's loss, d loss / d logprobs and logged metrics on `batch()`."""
    logprobs, old, ref, advantages, mask = batch()
    policy = logprobs.clone().requires_grad_()
    trainer = SimpleNamespace(
        args=SimpleNamespace(
            delta=None,
            steps_per_generation=1,
            use_bias_correction_kl=False,
            sapo_temperature_pos=TAU_POS,
            sapo_temperature_neg=TAU_NEG,
        ),
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=beta,
        epsilon_low=EPS_LOW,
        epsilon_high=epsilon_high,
        max_completion_length=MAX_COMPLETION_LENGTH,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        model=SimpleNamespace(training=True),
        accelerator=SimpleNamespace(num_processes=1, reduce=lambda x, reduction: x, gather=lambda x: x),
        _metrics={"train": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (policy, torch.zeros_like(policy), None),
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return loss.detach(), policy.grad, trainer._metrics["train"]


def rlvr_loss(name, agg, *, kl_coef=0.0, clip_low=EPS_LOW, clip_high=EPS_HIGH):
    logprobs, old, ref, advantages, mask = batch()
    policy = logprobs.clone().requires_grad_()
    loss, metrics = policy_loss(
        name,
        policy,
        old,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        sapo_tau_pos=TAU_POS,
        sapo_tau_neg=TAU_NEG,
        agg=agg,
        max_len=MAX_COMPLETION_LENGTH,
    )
    if kl_coef:
        loss = loss + kl_coef * aggregate(kl_penalty("k3", policy, ref), mask, agg, MAX_COMPLETION_LENGTH)
    loss.backward()
    return loss.detach(), policy.grad, metrics


def assert_same(ours, theirs):
    (our_loss, our_grad, _), (trl_loss_value, trl_grad, _) = ours, theirs
    assert abs(our_loss.item() - trl_loss_value.item()) < 1e-6
    assert (our_grad - trl_grad).abs().max().item() < 1e-6


@pytest.mark.parametrize(
    "trl_type, rlvr_agg",
    [
        ("grpo", "seq_mean_token_mean"),
        ("dapo", "token_mean"),
        ("bnpo", "token_mean"),
        ("dr_grpo", "seq_mean_token_sum_norm"),
        ("luspo", "seq_mean_token_sum"),  # TRL's LUSPO reduction: (per_token_loss * mask).sum(-1).mean()
    ],
)
def test_ppo_clip_matches_trl_loss_types(trl_type, rlvr_agg):
    ours, theirs = rlvr_loss("ppo", rlvr_agg), trl_loss(trl_type)
    assert_same(ours, theirs)
    assert 0 < ours[2]["clip_fraction"].item() < 1  # the batch does exercise the clip
    assert abs(ours[2]["clip_fraction"].item() - theirs[2]["clip_ratio/region_mean"][0]) < 1e-6
    assert abs(ours[2]["clip_fraction_low"].item() - theirs[2]["clip_ratio/low_mean"][0]) < 1e-6
    assert abs(ours[2]["clip_fraction_high"].item() - theirs[2]["clip_ratio/high_mean"][0]) < 1e-6


def test_gspo_matches_trl_sequence_level():
    assert_same(rlvr_loss("gspo", "seq_mean_token_mean"), trl_loss("grpo", level="sequence"))


def test_cispo_matches_trl():
    # TRL clamps the weight at epsilon_high (an absolute cap, 5.0 recommended) with no lower
    # bound: rlvr's clip_high = cap - 1, clip_low = 1 (lower bound 0, never reached).
    assert_same(rlvr_loss("cispo", "token_mean", clip_low=1.0, clip_high=0.5), trl_loss("cispo", epsilon_high=1.5))


def test_sapo_matches_trl():
    # TRL's sapo: -sigmoid(tau (rho - 1)) * 4 / tau * A, tau by the sign of A, aggregated per
    # sequence like its "grpo" loss type.
    ours, theirs = rlvr_loss("sapo", "seq_mean_token_mean"), trl_loss("sapo")
    assert_same(ours, theirs)
    # the check can fail: PPO's loss, or SAPO with the temperatures swapped, is far from TRL's
    assert abs(rlvr_loss("ppo", "seq_mean_token_mean")[0] - theirs[0]) > 1e-3
    logprobs, old, _, advantages, mask = batch()
    swapped, _ = policy_loss(
        "sapo",
        logprobs,
        old,
        advantages,
        mask,
        clip_low=EPS_LOW,
        clip_high=EPS_HIGH,
        sapo_tau_pos=TAU_NEG,
        sapo_tau_neg=TAU_POS,
        agg="seq_mean_token_mean",
    )
    assert abs(swapped - theirs[0]) > 1e-3


def test_k3_kl_term_matches_trl_beta():
    assert_same(rlvr_loss("ppo", "token_mean", kl_coef=0.04), trl_loss("dapo", beta=0.04))


def test_logprobs_and_entropy_match_trl_utils():
    gen = torch.Generator().manual_seed(7)
    logits = 3 * torch.randn(B, T, 33, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, 33, (B, T), generator=gen)
    assert (token_logprobs(logits, ids, chunk_size=5) - selective_log_softmax(logits, ids)).abs().max() < 1e-6
    assert (entropy_from_logits(logits, chunk_size=5) - trl_entropy_from_logits(logits)).abs().max() < 1e-6


def test_overlong_penalty_matches_trl_reward():
    from trl.rewards import get_soft_overlong_punishment

    lengths = list(range(0, 26))
    theirs = get_soft_overlong_punishment(max_completion_len=20, soft_punish_cache=8)([[1] * n for n in lengths])
    ours = overlong_penalty(torch.tensor(lengths), max_len=20, cache_len=8)
    assert (ours.double() - torch.tensor(theirs, dtype=torch.float64)).abs().max() < 1e-6
