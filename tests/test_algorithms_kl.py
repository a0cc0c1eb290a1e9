"""KL estimators against values worked out by hand."""

import math

import pytest
import torch

from rlvr.algorithms import kl_penalty


def test_kl_kinds_by_hand():
    # pi = 0.5, pi_ref = 0.25 -> logp - ref = log 2; k3 with x = ref - logp = -log 2: 0.5 - (-log 2) - 1
    lp = torch.tensor([[math.log(0.5), math.log(0.2)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25), math.log(0.2)]], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty("k1", lp, ref), torch.tensor([[math.log(2), 0.0]], dtype=torch.float64))
    torch.testing.assert_close(
        kl_penalty("k2", lp, ref), torch.tensor([[0.5 * math.log(2) ** 2, 0.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(kl_penalty("k3", lp, ref), torch.tensor([[math.log(2) - 0.5, 0.0]], dtype=torch.float64))


def test_k3_keeps_precision_when_policies_are_close():
    # exp(x) - x - 1 = x^2/2 + x^3/6 + ...; at x = 1e-5 in float32 the naive form gives 0.
    lp = torch.zeros(1, dtype=torch.float32)
    ref = torch.full((1,), 1e-5, dtype=torch.float32)
    assert kl_penalty("k3", lp, ref).item() == pytest.approx(0.5e-10, rel=1e-3)


def test_k3_gradient_by_hand():
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp) = 1 - pi_ref / pi = 1 - 0.5
    lp = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
    kl_penalty("k3", lp, torch.tensor([math.log(0.25)], dtype=torch.float64)).sum().backward()
    assert lp.grad.item() == pytest.approx(0.5)


def test_unknown_kind_raises():
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty("low_var_kl", torch.zeros(1), torch.zeros(1))


def test_k3_plus_is_the_k3_value_with_the_k2_gradient():
    gen = torch.Generator().manual_seed(0)
    ref = -torch.rand(4, 5, generator=gen, dtype=torch.float64)
    lp = (ref + 0.5 * torch.randn(4, 5, generator=gen, dtype=torch.float64)).requires_grad_()
    value = kl_penalty("k3+", lp, ref)
    assert torch.equal(value.detach(), kl_penalty("k3", lp, ref).detach())
    value.sum().backward()
    torch.testing.assert_close(lp.grad, (lp - ref).detach())  # d/dlogp of (logp - ref)^2 / 2
