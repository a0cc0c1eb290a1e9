"""DAPO dynamic sampling, overlong filter and soft overlong penalty, by hand."""

import pytest
import torch

from rlvr.algorithms import groups_to_refill, informative_group_mask, overlong_filter, overlong_penalty


def test_informative_groups_by_hand():
    # group 4 all correct, group 2 mixed, group 9 a lone response, group 5 all 0.3
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 3.0, 0.3, 0.3])
    group = torch.tensor([4, 4, 2, 2, 9, 5, 5])
    assert informative_group_mask(rewards, group).tolist() == [False, False, True, True, False, False, False]


def test_groups_to_refill():
    assert groups_to_refill(kept_groups=5, target_groups=8) == 3
    assert groups_to_refill(kept_groups=9, target_groups=8) == 0


def test_overlong_filter_by_hand():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert overlong_filter(mask, torch.tensor([False, True])).tolist() == [[True, True, False], [False, False, False]]


def test_overlong_penalty_by_hand():
    # L_max = 10, L_cache = 4: free up to 6, then (6 - |y|) / 4 down to -1 at 10, -1 beyond
    lengths = torch.tensor([5, 6, 7, 8, 10, 12])
    want = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, max_len=10, cache_len=4), want)
    torch.testing.assert_close(overlong_penalty(lengths, max_len=10, cache_len=4, factor=0.5), want * 0.5)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, max_len=10, cache_len=11)
