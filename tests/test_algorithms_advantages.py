"""Advantage estimators and GAE against values worked out by hand."""

import math

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
    eps_want = [(1 / 3) / (s7 + 1e-6), (-2 / 3) / (s7 + 1e-6), (1 / 3) / (s7 + 1e-6), 0.0, -1 / (s9 + 1e-6), 1 / (s9 + 1e-6)]
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


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_equal_rewards_and_lone_responses_get_zero(estimator):
    for eps in (0.0, 1e-6):
        out = advantages(estimator, torch.tensor([1.0, 1.0, 0.5]), torch.tensor([0, 0, 1]), eps=eps)
        torch.testing.assert_close(out, torch.zeros(3))
    assert advantages(estimator, torch.tensor([3.0]), torch.tensor([0])).item() == 0.0


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
