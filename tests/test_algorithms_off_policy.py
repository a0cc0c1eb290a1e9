"""Sampler/trainer mismatch corrections against values worked out by hand."""

import math

import pytest
import torch

from rlvr.algorithms import logprob_gap_metrics, off_policy_keep_mask, truncated_is_weights

# Row 0: token ratios pi_trainer / pi_sampler = (2, 0.25), then a padded position holding junk.
# Row 1: ratios (1, 1, 1).
SAMPLER = torch.tensor([[math.log(0.25), math.log(0.8), 5.0], [-1.0, -2.0, -3.0]], dtype=torch.float64)
TRAINER = torch.tensor([[math.log(0.5), math.log(0.2), -7.0], [-1.0, -2.0, -3.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


def test_truncated_is_weights_by_hand():
    token = truncated_is_weights(TRAINER, SAMPLER, MASK, cap=1.5)
    torch.testing.assert_close(token, torch.tensor([[1.5, 0.25, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64))
    # sequence ratio 2 * 0.25 = 0.5 < cap; geometric sqrt(0.5)
    seq = truncated_is_weights(TRAINER, SAMPLER, MASK, cap=1.5, level="sequence")
    torch.testing.assert_close(seq[0], torch.full((3,), 0.5, dtype=torch.float64))
    geo = truncated_is_weights(TRAINER, SAMPLER, MASK, cap=1.5, level="geometric")
    torch.testing.assert_close(geo[0], torch.full((3,), math.sqrt(0.5), dtype=torch.float64))
    assert truncated_is_weights(TRAINER, SAMPLER, MASK, cap=0.4, level="sequence")[0, 0].item() == pytest.approx(0.4)


def test_weights_never_overflow_and_carry_no_gradient():
    trainer = torch.full((1, 4), 0.0, requires_grad=True)
    sampler = torch.full((1, 4), -100.0)  # sequence ratio e^400 overflows float32
    w = truncated_is_weights(trainer, sampler, torch.ones(1, 4), cap=2.0, level="sequence")
    torch.testing.assert_close(w, torch.full((1, 4), 2.0))
    assert not w.requires_grad


def test_off_policy_keep_mask_by_hand():
    # token level, keep 1/3 <= w <= 3: w = 2 kept, w = 0.25 dropped; padding stays out
    keep = off_policy_keep_mask(TRAINER, SAMPLER, MASK, high=3.0)
    assert keep.tolist() == [[True, False, False], [True, True, True]]
    # sequence level w = 0.5: kept whole at high=3, dropped whole with low=0.6
    assert off_policy_keep_mask(TRAINER, SAMPLER, MASK, high=3.0, level="sequence").tolist()[0] == [True, True, False]
    dropped = off_policy_keep_mask(TRAINER, SAMPLER, MASK, high=3.0, low=0.6, level="sequence")
    assert dropped.tolist() == [[False, False, False], [True, True, True]]
    # low=0: no lower bound (TRL's vllm_importance_sampling_clip_min=None); w = 0.25 now kept
    assert off_policy_keep_mask(TRAINER, SAMPLER, MASK, high=3.0, low=0.0).tolist()[0] == [True, True, False]
    with pytest.raises(ValueError, match="bounds"):
        off_policy_keep_mask(TRAINER, SAMPLER, MASK, high=3.0, low=-1.0)


def test_gap_metrics_by_hand():
    m = logprob_gap_metrics(TRAINER, SAMPLER, MASK)
    # |log w| = log 2, 2 log 2, 0, 0, 0 over 5 valid tokens
    assert m["logprob_abs_diff_mean"].item() == pytest.approx(3 * math.log(2) / 5)
    assert m["logprob_abs_diff_max"].item() == pytest.approx(2 * math.log(2))
    # k3 = (w - 1) - log w: (1 - log 2) + (-0.75 + 2 log 2) + 0 + 0 + 0
    assert m["sampler_kl"].item() == pytest.approx((0.25 + math.log(2)) / 5)
    assert m["is_weight_mean"].item() == pytest.approx((2 + 0.25 + 3) / 5)


def test_unknown_level_raises():
    with pytest.raises(ValueError, match="unknown importance-ratio level"):
        truncated_is_weights(TRAINER, SAMPLER, MASK, cap=2.0, level="step")


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_weights_differ_from_the_ratios_exactly_where_a_correction_acts(level):
    """`weights != importance_ratios(...)` counts the tokens a correction capped or zeroed (policy/is_corrected)."""
    from rlvr.algorithms import importance_ratios, masked_is_weights, truncated_is_weights

    torch.manual_seed(0)
    trainer, sampler = torch.randn(4, 6) * 0.5, torch.randn(4, 6) * 0.5
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[0, 4:] = False
    ratios = importance_ratios(trainer, sampler, mask, level)
    capped = truncated_is_weights(trainer, sampler, mask, cap=1.5, level=level)
    assert torch.equal(mask & (capped != ratios), mask & (ratios > 1.5))
    zeroed = masked_is_weights(trainer, sampler, mask, low=0.8, high=1.5, level=level)
    assert torch.equal(mask & (zeroed != ratios), mask & ((ratios < 0.8) | (ratios > 1.5)))
