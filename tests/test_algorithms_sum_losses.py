"""Tinker's built-in losses (rlvr.algorithms.sum_losses) against their definitions, written out by hand."""

import pytest
import torch

from rlvr.algorithms.sum_losses import sum_loss


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(3, 5, generator=g) * 3).requires_grad_()
    sampler = logprobs.detach() + torch.randn(3, 5, generator=g) * 0.4  # ratios well outside [0.8, 1.2] too
    advantages = torch.randn(3, 5, generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False  # padding
    return logprobs, sampler, advantages, mask


def test_cross_entropy_is_a_weighted_sum_with_any_weights():
    logprobs, _, weights, mask = _case()
    loss = sum_loss("cross_entropy", logprobs, {"weights": weights}, mask)
    assert loss.item() == pytest.approx(-(weights * logprobs)[mask].sum().item(), rel=1e-6)


@pytest.mark.parametrize("name", ["importance_sampling", "ppo", "cispo"])
def test_policy_gradient_losses_match_tinkers_formulas(name):
    logprobs, sampler, advantages, mask = _case(1)
    low, high = 0.9, 1.1
    loss = sum_loss(name, logprobs, {"advantages": advantages, "logprobs": sampler}, mask, (low, high))
    ratio = torch.exp(logprobs - sampler)
    clipped = ratio.clamp(low, high)
    expected = {
        "importance_sampling": -(ratio * advantages),
        "ppo": -torch.minimum(ratio * advantages, clipped * advantages),
        "cispo": -(clipped.detach() * advantages * logprobs),
    }[name][mask].sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    (grad,) = torch.autograd.grad(loss, logprobs)
    (expected_grad,) = torch.autograd.grad(expected, logprobs)
    torch.testing.assert_close(grad, expected_grad)


def test_unknown_loss_is_named():
    logprobs, sampler, advantages, mask = _case()
    with pytest.raises(ValueError, match="unknown loss 'dro'"):
        sum_loss("dro", logprobs, {"advantages": advantages, "logprobs": sampler}, mask)
