"""rlvr's algorithm functions against verl's and SkyRL's own code, run on the same random tensors.

verl and SkyRL are not installed here (neither is a dependency of rlvr), so each reference below
is a minimal transcription of the peer's function at a fixed commit: only the branches compared,
argument plumbing (config objects, metrics, logging) removed, the arithmetic unchanged. They live
in this test only, never in src.

- verl, github.com/verl-project/verl @ 1dda039b9c6311889a9c9a26040677e1254814f9 (2026-08-22)
  (verl/utils/torch_functional.py, verl/trainer/ppo/core_algos.py, rollout_corr_helper.py).
  Copyright 2024 Bytedance Ltd. and/or its affiliates; Apache License 2.0.
- SkyRL, github.com/NovaSky-AI/SkyRL @ a9564572eb8e91076be43c1bd5e4615e3de17265
  (skyrl/backends/skyrl_train/utils/ppo_utils.py, off_policy_correction_utils.py, torch_utils.py).
  Apache License 2.0 (ppo_utils.py: adapted from verl, Copyright 2024 Bytedance Ltd. and/or its
  affiliates, Copyright 2022 The HuggingFace Team).
  http://www.apache.org/licenses/LICENSE-2.0

Values are float64; every comparison is to 1e-6 absolute, masks exactly.
"""

import math
from collections import defaultdict

import pytest
import torch

from rlvr.algorithms import advantages, kl_penalty, off_policy_keep_mask, policy_loss, truncated_is_weights

TOL = 1e-6

# --------------------------------------------------------------------------------------------
# verl @ 1dda039b, verl/utils/torch_functional.py


def verl_masked_sum(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_masked_mean(values, mask, axis=None):
    s = verl_masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def verl_masked_var(values, mask, unbiased=True):
    mean = verl_masked_mean(values, mask)
    centered_values = values - mean
    variance = verl_masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def verl_masked_whiten(values, mask, shift_mean=True):
    mean, var = verl_masked_mean(values, mask), verl_masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


# verl @ 1dda039b, verl/trainer/ppo/core_algos.py


def verl_reinforce_plus_plus(token_level_rewards, response_mask, gamma):
    """compute_reinforce_plus_plus_outcome_advantage (config.gamma passed as gamma)."""
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running_return = 0
        for t in reversed(range(token_level_rewards.shape[1])):
            new_running_return = token_level_rewards[:, t] + gamma * running_return
            returns[:, t] = new_running_return * response_mask[:, t]
            running_return = new_running_return * response_mask[:, t] + running_return * (1 - response_mask[:, t])
        advantages = verl_masked_whiten(returns, response_mask)
        advantages = advantages * response_mask
    return advantages, returns


def verl_reinforce_plus_plus_baseline(token_level_rewards, response_mask, index):
    """compute_reinforce_plus_plus_baseline_outcome_advantage."""
    response_length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
        for i in range(bsz):
            scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
        scores = verl_masked_whiten(scores, response_mask) * response_mask
    return scores, scores


def verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


def verl_kl_penalty(logprob, ref_logprob, kl_penalty):
    # The '+' is stripped before dispatch since verl PR #6058 (2026-04); before it, every
    # '+' name fell through to NotImplementedError.
    base_kl_penalty = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = verl_kl_penalty_forward(logprob, ref_logprob, base_kl_penalty)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, global_batch_size=None):
    """agg_loss, the token-mean, token-sum and seq-mean-token-mean branches, dp_size = 1."""
    if loss_agg_mode == "token-mean":
        return verl_masked_sum(loss_mat, loss_mask) / loss_mask.sum()
    if loss_agg_mode == "token-sum":
        return verl_masked_sum(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        return verl_masked_sum(seq_losses, seq_mask) / global_batch_size
    raise NotImplementedError


def verl_policy_loss_vanilla(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode,
    clip_ratio,
    clip_ratio_c=3.0,
    global_batch_size=None,
):
    """compute_policy_loss_vanilla (clip_ratio_low = clip_ratio_high = clip_ratio, no IS weights)."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return verl_agg_loss(pg_losses, response_mask, loss_agg_mode, global_batch_size)


def verl_rollout_tis_weights(log_ratio, response_mask, rollout_is, rollout_is_threshold):
    """compute_rollout_correction_weights (rollout_corr_helper.py), the TIS branch: a float
    threshold, no batch normalisation, metrics removed. SAFETY_BOUND = 20.0."""
    if rollout_is == "token":
        raw_rollout_is_weights = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        log_ratio_sum = verl_masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw_rollout_is_weights = torch.exp(torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).expand_as(log_ratio)
    raw_rollout_is_weights = raw_rollout_is_weights * response_mask
    return raw_rollout_is_weights.clamp(max=rollout_is_threshold).detach()


# --------------------------------------------------------------------------------------------
# SkyRL @ a9564572, skyrl/backends/skyrl_train/utils/torch_utils.py, ppo_utils.py


def skyrl_masked_mean(tensor, mask, dim=None):
    return (tensor * mask).sum(axis=dim) / mask.sum(axis=dim).clamp(min=1.0)


def skyrl_safe_exp_delta(delta, clip=20.0, out_dtype=None):
    y = torch.clamp(delta.to(torch.float32), -clip, clip).exp()
    return y.to(out_dtype or delta.dtype)


def skyrl_ppo_policy_loss(log_probs, old_log_probs, advantages, eps_clip_low, eps_clip_high, loss_mask):
    """ppo_policy_loss, policy_loss_type="regular", no off-policy correction."""
    ratio = skyrl_safe_exp_delta(log_probs - old_log_probs, clip=20.0, out_dtype=log_probs.dtype)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - eps_clip_low, 1 + eps_clip_high) * advantages
    loss = -torch.min(surr1, surr2)
    return skyrl_reduce_loss(loss, loss_mask)


def skyrl_reduce_loss(loss, loss_mask):
    return (loss * loss_mask).sum() if loss_mask is not None else loss.sum()


def skyrl_apply_loss_reduction_to_advantages_minibatch(advantages, loss_mask, loss_reduction, max_seq_len):
    """apply_loss_reduction_to_advantages_minibatch, the token_mean / sequence_mean /
    seq_mean_token_sum_norm branches."""
    batch_size = advantages.shape[0]
    if loss_reduction == "token_mean":
        return advantages / loss_mask.sum().clamp(min=1)
    if loss_reduction == "sequence_mean":
        return advantages / (batch_size * loss_mask.sum(dim=-1, keepdim=True).clamp(min=1))
    if loss_reduction == "seq_mean_token_sum_norm":
        return advantages / (batch_size * max_seq_len)
    raise NotImplementedError


# SkyRL @ a9564572, skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py (masks and
# ratios only, metrics removed)


def skyrl_sequence_tis_ratio(old_log_probs, rollout_logprobs, loss_mask, cap):
    """compute_tis_ratio, tis_ratio_type="sequence"."""
    token_tis_log_ratio = old_log_probs - rollout_logprobs
    seq_tis_log_ratio = (token_tis_log_ratio * loss_mask).sum(dim=-1, keepdim=True)
    seq_tis_ratio = skyrl_safe_exp_delta(seq_tis_log_ratio, clip=20.0, out_dtype=old_log_probs.dtype)
    return torch.clamp(seq_tis_ratio, max=cap).detach()


def skyrl_token_mask(old_log_probs, rollout_logprobs, loss_mask, low, high):
    """compute_token_mask."""
    token_is_ratio = skyrl_safe_exp_delta(old_log_probs - rollout_logprobs, clip=20.0, out_dtype=old_log_probs.dtype)
    in_bounds = (token_is_ratio >= low) & (token_is_ratio <= high)
    return (in_bounds | (loss_mask == 0)).float()


def skyrl_sequence_mask(old_log_probs, rollout_logprobs, loss_mask, metric, low, high):
    """compute_sequence_mask, sequence_mask_metric = "geometric" or "product"."""
    token_tis_log_ratio = old_log_probs - rollout_logprobs
    seq_tis_log_ratio = (token_tis_log_ratio * loss_mask).sum(dim=-1, keepdim=True)
    if metric == "geometric":
        num_tokens = loss_mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
        ratio = skyrl_safe_exp_delta(seq_tis_log_ratio / num_tokens, clip=20.0, out_dtype=old_log_probs.dtype)
    else:
        ratio = skyrl_safe_exp_delta(seq_tis_log_ratio, clip=20.0, out_dtype=old_log_probs.dtype)
    return (~(ratio > high) & ~(ratio < low)).float()


# --------------------------------------------------------------------------------------------

B, T = 12, 9
LENGTHS = torch.tensor([9, 5, 1, 3, 7, 2, 9, 4, 6, 8, 3, 5])
MASK = (torch.arange(T) < LENGTHS[:, None]).to(torch.float64)
GROUP = torch.tensor([4, 4, 4, 11, 11, 7, 7, 7, 7, 2, 2, 2])  # groups of 3, 2, 4, 3


def random_batch(seed, spread=0.4):
    gen = torch.Generator().manual_seed(seed)
    old = -2.0 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    new = old + spread * torch.randn(B, T, generator=gen, dtype=torch.float64)
    rewards = torch.randn(B, generator=gen, dtype=torch.float64)
    return old, new, rewards


def outcome_token_rewards(rewards):
    """verl's reward layout: the outcome reward on each response's last valid token."""
    token_rewards = torch.zeros(B, T, dtype=torch.float64)
    token_rewards[torch.arange(B), LENGTHS - 1] = rewards
    return token_rewards


def assert_close_on_valid(ours_per_response, theirs_per_token):
    gap = torch.where(MASK.bool(), ours_per_response[:, None] - theirs_per_token, 0.0).abs().max().item()
    assert gap < TOL, gap


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_pp_matches_verl_token_whitening(seed):
    # verl whitens with rsqrt(var + 1e-8); rlvr adds eps to the std, like its grpo: compared at
    # eps=0, where only verl's 1e-8 under the root (a relative 5e-9) separates them.
    _, _, rewards = random_batch(seed)
    theirs, _ = verl_reinforce_plus_plus(outcome_token_rewards(rewards), MASK, gamma=1.0)
    ours = advantages("reinforce_pp", rewards, GROUP, lengths=LENGTHS, eps=0.0)
    assert_close_on_valid(ours, theirs)
    # the lengths matter: whitening per response instead of per token is far off
    unweighted = advantages("reinforce_pp", rewards, GROUP, eps=0.0)
    assert torch.where(MASK.bool(), unweighted[:, None] - theirs, 0.0).abs().max() > 1e-2


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_pp_baseline_matches_verl_token_whitening(seed):
    _, _, rewards = random_batch(seed)
    theirs, _ = verl_reinforce_plus_plus_baseline(outcome_token_rewards(rewards), MASK, GROUP.tolist())
    ours = advantages("reinforce_pp_baseline", rewards, GROUP, lengths=LENGTHS, eps=0.0)
    assert_close_on_valid(ours, theirs)


@pytest.mark.parametrize("seed", range(5))
def test_k3_plus_matches_verl_value_and_gradient(seed):
    ref, logprobs, _ = random_batch(seed, spread=0.5)
    ours_lp, theirs_lp = logprobs.clone().requires_grad_(), logprobs.clone().requires_grad_()
    ours, theirs = kl_penalty("k3+", ours_lp, ref), verl_kl_penalty(theirs_lp, ref, "k3+")
    assert (ours - theirs).abs().max().item() < TOL
    (ours * MASK).sum().backward()
    (theirs * MASK).sum().backward()
    assert (ours_lp.grad - theirs_lp.grad).abs().max().item() < TOL
    # and the gradient is k2's, not k3's
    k3_lp = logprobs.clone().requires_grad_()
    (verl_kl_penalty(k3_lp, ref, "k3") * MASK).sum().backward()
    assert (ours_lp.grad - k3_lp.grad).abs().max().item() > 1e-2


def clipping_batch(seed):
    """Advantages per response, with one A < 0 token at ratio 5, where the dual clip acts."""
    old, new, adv = random_batch(seed)
    new[0, 0], adv[0] = old[0, 0] + math.log(5.0), -1.0
    return old, new, adv


@pytest.mark.parametrize("seed", range(3))
def test_ppo_matches_verl_vanilla_only_with_dual_clip_3(seed):
    old, new, adv = clipping_batch(seed)
    theirs = verl_policy_loss_vanilla(old, new, adv[:, None], MASK, "token-mean", clip_ratio=0.2)
    ours, m = policy_loss("ppo", new, old, adv, MASK, clip_low=0.2, clip_high=0.2, dual_clip=3.0, agg="token_mean")
    assert abs(ours.item() - theirs.item()) < TOL and m["dual_clip_fraction"] > 0
    plain, _ = policy_loss("ppo", new, old, adv, MASK, clip_low=0.2, clip_high=0.2, agg="token_mean")
    assert abs(plain.item() - theirs.item()) > 1e-3


@pytest.mark.parametrize("seed", range(3))
def test_seq_mean_counts_empty_rows_like_verl_only_given_global_batch_size(seed):
    old, new, adv = clipping_batch(seed)
    mask = MASK.clone()
    mask[5] = 0.0  # a response with no loss token (e.g. removed by the overlong filter)
    ours, _ = policy_loss(
        "ppo", new, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0, agg="seq_mean_token_mean"
    )
    given = verl_policy_loss_vanilla(old, new, adv[:, None], mask, "seq-mean-token-mean", 0.2, global_batch_size=B)
    assert abs(ours.item() - given.item()) < TOL
    default = verl_policy_loss_vanilla(old, new, adv[:, None], mask, "seq-mean-token-mean", 0.2)
    assert abs(ours.item() * B / (B - 1) - default.item()) < TOL  # verl's default: non-empty rows only


@pytest.mark.parametrize("seed", range(3))
def test_token_sum_and_reductions_match_skyrl(seed):
    """SkyRL's policy loss is a plain masked sum (rlvr's token_sum); its loss_reduction is applied
    by dividing the advantages first, which gives rlvr's mean aggregations."""
    old, new, adv = random_batch(seed)
    mask = MASK.clone()
    mask[5] = 0.0  # SkyRL's sequence_mean counts it as a row, like rlvr
    for rlvr_agg, skyrl_reduction in [
        ("token_sum", None),
        ("token_mean", "token_mean"),
        ("seq_mean_token_mean", "sequence_mean"),
        ("seq_mean_token_sum_norm", "seq_mean_token_sum_norm"),
    ]:
        token_adv = adv[:, None].expand(B, T)
        if skyrl_reduction:
            token_adv = skyrl_apply_loss_reduction_to_advantages_minibatch(token_adv, mask, skyrl_reduction, 11)
        theirs = skyrl_ppo_policy_loss(new, old, token_adv, 0.2, 0.28, mask)
        ours, _ = policy_loss("ppo", new, old, adv, mask, clip_low=0.2, clip_high=0.28, agg=rlvr_agg, max_len=11)
        assert abs(ours.item() - theirs.item()) < TOL, rlvr_agg


@pytest.mark.parametrize("seed", range(5))
def test_off_policy_masks_and_sequence_tis_match_skyrl(seed):
    sampler, trainer, _ = random_batch(seed, spread=0.3)
    dropped = 0
    for level, skyrl_mask in [
        ("token", lambda low, high: skyrl_token_mask(trainer, sampler, MASK, low, high)),
        ("geometric", lambda low, high: skyrl_sequence_mask(trainer, sampler, MASK, "geometric", low, high)),
        ("sequence", lambda low, high: skyrl_sequence_mask(trainer, sampler, MASK, "product", low, high)),
    ]:
        for low, high in [(0.7, 1.4), (0.9, 1.1), (0.5, 2.0)]:
            ours = off_policy_keep_mask(trainer, sampler, MASK, low=low, high=high, level=level)
            theirs = (MASK * skyrl_mask(low, high)).bool()  # SkyRL multiplies it into the loss mask
            assert torch.equal(ours, theirs), (level, low, high)
            dropped += int((MASK.bool() & ~ours).sum())
    assert dropped > 0  # the bounds do bite
    for cap in (1.5, 5.0):
        ours = truncated_is_weights(trainer, sampler, MASK, cap=cap, level="sequence")
        theirs = skyrl_sequence_tis_ratio(trainer, sampler, MASK, cap).expand(B, T)
        assert torch.where(MASK.bool(), ours - theirs, 0.0).abs().max().item() < TOL


@pytest.mark.parametrize("seed", range(3))
def test_token_sum_matches_verl_token_sum(seed):
    old, new, adv = clipping_batch(seed)
    theirs = verl_policy_loss_vanilla(old, new, adv[:, None], MASK, "token-sum", clip_ratio=0.2)
    ours, _ = policy_loss("ppo", new, old, adv, MASK, clip_low=0.2, clip_high=0.2, dual_clip=3.0, agg="token_sum")
    assert abs(ours.item() - theirs.item()) < TOL


@pytest.mark.parametrize("seed", range(5))
def test_truncated_is_weights_match_verl_rollout_is(seed):
    sampler, trainer, _ = random_batch(seed, spread=0.3)
    for level in ("token", "sequence"):
        for cap in (1.2, 2.0):
            ours = truncated_is_weights(trainer, sampler, MASK, cap=cap, level=level)
            theirs = verl_rollout_tis_weights(trainer - sampler, MASK, level, cap)
            assert torch.where(MASK.bool(), ours - theirs, 0.0).abs().max().item() < TOL, (level, cap)
