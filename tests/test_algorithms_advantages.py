"""Advantage estimators against values worked out by hand."""

import math
import statistics

import pytest
import torch

from rlvr.algorithms import ESTIMATORS, advantages

# Three groups, ids not contiguous and not sorted: 7 = {1, 0, 1}, 3 = {5} (a group of one),
# 9 = {2, 4}.
REWARDS = [1.0, 0.0, 1.0, 5.0, 2.0, 4.0]
GROUP = [7, 7, 7, 3, 9, 9]


def run(estimator, dtype=torch.float64, **kw):
    return advantages(estimator, torch.tensor(REWARDS, dtype=dtype), torch.tensor(GROUP), **kw)


def test_grpo_by_hand():
    # group 7: mean 2/3, centred (1/3, -2/3, 1/3), unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3
    # group 9: mean 3, centred (-1, 1), unbiased var (1 + 1) / 1 = 2; group 3: 0
    s7, s9 = math.sqrt(1 / 3), math.sqrt(2)
    want = [(1 / 3) / s7, (-2 / 3) / s7, (1 / 3) / s7, 0.0, -1 / s9, 1 / s9]
    torch.testing.assert_close(run("grpo", eps=0.0), torch.tensor(want, dtype=torch.float64))
    # the default eps = 1e-6 sits in the denominator
    eps_want = [
        (1 / 3) / (s7 + 1e-6),
        (-2 / 3) / (s7 + 1e-6),
        (1 / 3) / (s7 + 1e-6),
        0.0,
        -1 / (s9 + 1e-6),
        1 / (s9 + 1e-6),
    ]
    torch.testing.assert_close(run("grpo"), torch.tensor(eps_want, dtype=torch.float64))


def test_dr_grpo_is_grpo_without_std():
    want = torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0, -1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(run("dr_grpo"), want)
    torch.testing.assert_close(run("grpo", std_normalize=False), want)


def test_rloo_by_hand():
    # r_i - mean of the others: 1 - (0+1)/2, 0 - (1+1)/2, 1 - (1+0)/2, lone -> 0, 2 - 4, 4 - 2
    want = torch.tensor([0.5, -1.0, 0.5, 0.0, -2.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(run("rloo"), want)


def test_reinforce_pp_baseline_by_hand():
    # centred (1/3, -2/3, 1/3, 0, -1, 1), batch mean 0, unbiased var (6/9 + 2) / 5 = 8/15
    std = math.sqrt(8 / 15)
    want = torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0, -1.0, 1.0], dtype=torch.float64) / std
    torch.testing.assert_close(run("reinforce_pp_baseline", eps=0.0), want)


def test_reinforce_pp_whitens_over_tokens():
    # Response i counts lengths[i] times: the batch's tokens, each carrying its response's return.
    lengths = [2, 1, 1, 3, 0, 1]  # the fifth response has no loss token: it does not count
    tokens = [r for r, n in zip(REWARDS, lengths) for _ in range(n)]
    mean, std = statistics.mean(tokens), statistics.stdev(tokens)  # stdev: N - 1 = 7
    want = torch.tensor([(r - mean) / std for r in REWARDS], dtype=torch.float64)
    torch.testing.assert_close(run("reinforce_pp", eps=0.0, lengths=torch.tensor(lengths)), want)
    # without lengths every response counts once, and groups play no part
    mean, std = statistics.mean(REWARDS), statistics.stdev(REWARDS)
    want = torch.tensor([(r - mean) / (std + 1e-6) for r in REWARDS], dtype=torch.float64)
    torch.testing.assert_close(run("reinforce_pp"), want)


def test_reinforce_pp_baseline_with_lengths_whitens_centred_rewards_over_tokens():
    centred = [1 / 3, -2 / 3, 1 / 3, 0.0, -1.0, 1.0]
    lengths = [4, 1, 2, 5, 3, 3]
    tokens = [c for c, n in zip(centred, lengths) for _ in range(n)]
    mean, std = statistics.mean(tokens), statistics.stdev(tokens)
    want = torch.tensor([(c - mean) / std for c in centred], dtype=torch.float64)
    got = run("reinforce_pp_baseline", eps=0.0, lengths=torch.tensor(lengths))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_equal_rewards_that_do_not_average_exactly_get_zero(estimator):
    # 7 rewards of 0.1 average to 0.1 + 1 ulp in float32: the centred values are ~1e-9, not 0,
    # and dividing them by their own std (eps=0) would give +-0.93 everywhere.
    rewards = torch.full((7,), 0.1)
    for eps in (0.0, 1e-6):
        out = advantages(estimator, rewards, torch.zeros(7, dtype=torch.long), eps=eps, lengths=torch.arange(1, 8))
        assert out.abs().max().item() < 1e-6, estimator


def test_lengths_must_match_and_be_non_negative():
    with pytest.raises(ValueError, match="lengths must be"):
        run("reinforce_pp", lengths=torch.ones(3))
    with pytest.raises(ValueError, match=">= 0"):
        run("reinforce_pp", lengths=torch.tensor([1, 1, -1, 1, 1, 1]))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_equal_rewards_and_lone_responses_get_zero(estimator):
    for eps in (0.0, 1e-6):
        out = advantages(estimator, torch.tensor([1.0, 1.0, 0.5]), torch.tensor([0, 0, 1]), eps=eps)
        torch.testing.assert_close(out, torch.zeros(3))
    assert advantages(estimator, torch.tensor([3.0]), torch.tensor([0])).item() == 0.0


def test_reinforce_pp_has_no_group_baseline():
    # an all-equal group is not uninformative to a batch baseline; a batch of one is
    out = advantages("reinforce_pp", torch.tensor([1.0, 1.0, 0.5]), torch.tensor([0, 0, 1]), eps=0.0)
    # mean 5/6, deviations (1/6, 1/6, -1/3), unbiased var (1/36 + 1/36 + 1/9) / 2 = 1/12
    std = math.sqrt(1 / 12)
    torch.testing.assert_close(out, torch.tensor([1 / 6 / std, 1 / 6 / std, -1 / 3 / std]))
    assert advantages("reinforce_pp", torch.tensor([3.0]), torch.tensor([0])).item() == 0.0


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_order_of_batch_does_not_matter(estimator):
    perm = torch.tensor([5, 2, 0, 3, 1, 4])
    base = run(estimator)
    shuffled = advantages(estimator, torch.tensor(REWARDS, dtype=torch.float64)[perm], torch.tensor(GROUP)[perm])
    torch.testing.assert_close(shuffled, base[perm])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_kept(dtype):
    assert run("grpo", dtype=dtype).dtype == dtype
    assert advantages("grpo", torch.tensor([1, 0]), torch.tensor([0, 0])).dtype == torch.float32


def test_bad_input_raises():
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        run("ppo")
    with pytest.raises(ValueError, match="must both be"):
        advantages("grpo", torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))
