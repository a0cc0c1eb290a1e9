"""Policy losses and loss aggregation against values and gradients worked out by hand."""

import math

import pytest
import torch

from rlvr.algorithms import AGGREGATIONS, LOSSES, aggregate
from rlvr.algorithms import policy_loss as _policy_loss

# The hand-worked values below clip at PPO's epsilon = 0.2, gate SAPO at the paper's
# temperatures, mask DPPO at its TV threshold and aggregate per token, unless a test says otherwise.
HAND_WORKED = {
    "clip_low": 0.2,
    "clip_high": 0.2,
    "sapo_tau_pos": 1.0,
    "sapo_tau_neg": 1.05,
    "dppo_delta": 0.15,
    "agg": "token_mean",
}


def policy_loss(*args, **options):
    return _policy_loss(*args, **(HAND_WORKED | options))


# Two responses, old_logprobs = 0 so that logprobs = log(rho). Row 0 has 2 valid tokens
# (rho 1.5, 0.9) and one padded position; row 1 has 3 (rho 0.5, 1.0, 2.0). A = (+1, -2).
RATIOS = [[1.5, 0.9, 1.1], [0.5, 1.0, 2.0]]
MASK = [[1, 1, 0], [1, 1, 1]]
ADV = [1.0, -2.0]


def inputs(dtype=torch.float64):
    logprobs = torch.tensor(RATIOS, dtype=dtype).log().requires_grad_()
    return logprobs, torch.zeros(2, 3, dtype=dtype), torch.tensor(ADV, dtype=dtype), torch.tensor(MASK)


def test_ppo_by_hand_every_aggregation():
    # per token, -min(rho A, clip(rho, 0.8, 1.2) A):
    #   row 0 (A=+1): rho 1.5 -> -1.2 (clipped high), rho 0.9 -> -0.9
    #   row 1 (A=-2): rho 0.5 -> 1.6 (clipped low), rho 1.0 -> 2.0, rho 2.0 -> 4.0 (unclipped branch)
    want = {
        "token_mean": (-1.2 - 0.9 + 1.6 + 2.0 + 4.0) / 5,
        "seq_mean_token_mean": ((-1.2 - 0.9) / 2 + (1.6 + 2.0 + 4.0) / 3) / 2,
        "seq_mean_token_sum": ((-1.2 - 0.9) + (1.6 + 2.0 + 4.0)) / 2,
        "seq_mean_token_sum_norm": ((-1.2 - 0.9) + (1.6 + 2.0 + 4.0)) / 2 / 4,
        "token_sum": -1.2 - 0.9 + 1.6 + 2.0 + 4.0,
    }
    for agg, value in want.items():
        lp, old, adv, mask = inputs()
        loss, _ = policy_loss("ppo", lp, old, adv, mask, agg=agg, max_len=4)
        assert loss.item() == pytest.approx(value, abs=1e-12), agg


def test_ppo_metrics_by_hand():
    lp, old, adv, mask = inputs()
    _, m = policy_loss("ppo", lp, old, adv, mask)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.9 + 0.5 + 1.0 + 2.0) / 5)
    assert m["ratio_min"].item() == pytest.approx(0.5) and m["ratio_max"].item() == pytest.approx(2.0)
    assert m["clip_fraction"].item() == pytest.approx(2 / 5)
    assert m["clip_fraction_low"].item() == pytest.approx(1 / 5)
    assert m["clip_fraction_high"].item() == pytest.approx(1 / 5)
    k3 = sum(r - 1 - math.log(r) for r in (1.5, 0.9, 0.5, 1.0, 2.0)) / 5
    assert m["approx_kl"].item() == pytest.approx(k3)


def test_ppo_gradient_by_hand():
    # token_mean over 5 tokens: d/dlogp of -rho A = -A rho / 5 where unclipped, 0 where clipped
    lp, old, adv, mask = inputs()
    policy_loss("ppo", lp, old, adv, mask)[0].backward()
    want = torch.tensor([[0.0, -0.9 / 5, 0.0], [0.0, 2 * 1.0 / 5, 2 * 2.0 / 5]], dtype=torch.float64)
    torch.testing.assert_close(lp.grad, want)


def test_ppo_clip_higher_and_dual_clip():
    lp, old, adv, mask = inputs()
    loss, _ = policy_loss("ppo", lp, old, adv, mask, clip_high=0.28)
    assert loss.item() == pytest.approx((-1.28 - 0.9 + 1.6 + 2.0 + 4.0) / 5)
    # dual clip c = 1.5 bounds A<0 losses at -c A = 3: the rho = 2 token's 4.0 becomes 3.0
    loss, m = policy_loss("ppo", lp, old, adv, mask, dual_clip=1.5)
    assert loss.item() == pytest.approx((-1.2 - 0.9 + 1.6 + 2.0 + 3.0) / 5)
    assert m["dual_clip_fraction"].item() == pytest.approx(1 / 5)
    loss.backward()
    assert lp.grad[1, 2].item() == 0.0  # the bounded token gets no gradient
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss("gspo", lp, old, adv, mask, dual_clip=3.0)


def test_gspo_by_hand():
    # s_0 = exp(mean(log 1.5, log 0.9)) = sqrt(1.35) (unclipped at 0.2), s_1 = (0.5*1*2)^(1/3) = 1
    s0 = math.sqrt(1.35)
    lp, old, adv, mask = inputs()
    loss, m = policy_loss("gspo", lp, old, adv, mask, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx((-s0 + 2.0) / 2)
    assert m["ratio_mean"].item() == pytest.approx((2 * s0 + 3 * 1.0) / 5)
    # d/dlogp_t of -A s_i averaged over the |y_i| tokens and 2 rows: -A s_i / |y_i| / 2
    loss.backward()
    want = torch.tensor([[-s0 / 2 / 2, -s0 / 2 / 2, 0.0], [2 / 3 / 2, 2 / 3 / 2, 2 / 3 / 2]], dtype=torch.float64)
    torch.testing.assert_close(lp.grad, want)
    # with clip 0.1, s_0 = 1.162 > 1.1 is clipped: -1.1 on each token, no gradient
    lp, old, adv, mask = inputs()
    loss, m = policy_loss("gspo", lp, old, adv, mask, clip_low=0.1, clip_high=0.1, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx((-1.1 + 2.0) / 2)
    assert m["clip_fraction"].item() == pytest.approx(2 / 5)


def test_cispo_by_hand():
    # weight sg(clamp(rho, 0.8, 1.2)): row 0 (1.2, 0.9), row 1 (0.8, 1.0, 1.2); l = -w A log(rho)
    lp, old, adv, mask = inputs()
    loss, m = policy_loss("cispo", lp, old, adv, mask)
    per_token = [
        -1.2 * 1 * math.log(1.5),
        -0.9 * 1 * math.log(0.9),
        -0.8 * -2 * math.log(0.5),
        -1.0 * -2 * math.log(1.0),
        -1.2 * -2 * math.log(2.0),
    ]
    assert loss.item() == pytest.approx(sum(per_token) / 5)
    assert m["clip_fraction"].item() == pytest.approx(3 / 5)  # 1.5, 0.5 and 2.0 are clamped
    loss.backward()  # -w A / 5: clipped tokens keep a gradient
    want = torch.tensor([[-1.2 / 5, -0.9 / 5, 0.0], [1.6 / 5, 2.0 / 5, 2.4 / 5]], dtype=torch.float64)
    torch.testing.assert_close(lp.grad, want)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_sapo_by_hand():
    # l = -sigmoid(tau (rho - 1)) * 4 / tau * A; tau = 1.0 on row 0 (A = +1), 1.05 on row 1 (A = -2)
    lp, old, adv, mask = inputs()
    loss, m = policy_loss("sapo", lp, old, adv, mask)
    per_token = [-sigmoid(1.0 * (r - 1)) * 4 / 1.0 * 1.0 for r in (1.5, 0.9)]
    per_token += [-sigmoid(1.05 * (r - 1)) * 4 / 1.05 * -2.0 for r in (0.5, 1.0, 2.0)]
    assert loss.item() == pytest.approx(sum(per_token) / 5)
    assert m["clip_fraction"].item() == 0.0  # a soft gate: nothing is clipped
    # d l / d logp = -A * 4 s (1 - s) * rho with s = sigmoid(tau (rho - 1)): at rho = 1 it is -A,
    # PPO's on-policy gradient; away from 1 it shrinks smoothly instead of vanishing at a clip.
    loss.backward()

    def grad(r, tau, a):
        s = sigmoid(tau * (r - 1))
        return -a * 4 * s * (1 - s) * r / 5

    want = [
        [grad(1.5, 1.0, 1.0), grad(0.9, 1.0, 1.0), 0.0],
        [grad(0.5, 1.05, -2.0), grad(1.0, 1.05, -2.0), grad(2.0, 1.05, -2.0)],
    ]
    torch.testing.assert_close(lp.grad, torch.tensor(want, dtype=torch.float64))
    assert lp.grad[1, 1].item() == pytest.approx(2.0 / 5)
    lp, old, adv, mask = inputs()
    with pytest.raises(ValueError, match="sapo_tau_pos"):
        _policy_loss("sapo", lp, old, adv, mask, clip_low=0.2, clip_high=0.2, agg="token_mean")


@pytest.mark.parametrize("name", LOSSES)
def test_gradcheck_float64(name):
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    lp = (old + 0.3 * torch.randn(3, 5, generator=gen, dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    log_ratio = (lp - old).detach()
    for agg in AGGREGATIONS:

        def fn(x):
            # CISPO's and DPPO's weights are stop-gradients, which finite differences cannot see:
            # hold them fixed by moving old_logprobs with x, so only the logprob path is checked.
            x_old = x - log_ratio if name in ("cispo", "dppo_tv", "dppo_kl") else old
            return policy_loss(name, x, x_old, adv, mask, clip_low=0.1, clip_high=0.15, agg=agg, max_len=5)[0]

        assert torch.autograd.gradcheck(fn, (lp,))


@pytest.mark.parametrize("name", LOSSES)
def test_garbage_in_padding_is_ignored(name):
    lp, old, adv, mask = inputs()
    clean, _ = policy_loss(name, lp, old, adv, mask)
    clean.backward()
    dirty_lp = lp.detach().clone()
    dirty_lp[0, 2] = float("nan")
    dirty_lp.requires_grad_()
    dirty_old = old.clone()
    dirty_old[0, 2] = float("-inf")
    dirty, m = policy_loss(name, dirty_lp, dirty_old, adv, mask)
    dirty.backward()
    assert dirty.item() == pytest.approx(clean.item())
    torch.testing.assert_close(dirty_lp.grad, lp.grad)
    assert all(torch.isfinite(v) for v in m.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", LOSSES)
def test_dtypes_and_token_advantages(name, dtype):
    lp, old, adv, mask = inputs(dtype)
    loss, m = policy_loss(name, lp, old, adv, mask)
    assert loss.dtype == dtype and m["ratio_mean"].dtype == dtype
    per_token_adv = adv.unsqueeze(-1).expand(2, 3)
    same, _ = policy_loss(name, lp, old, per_token_adv, mask)
    assert same.item() == pytest.approx(loss.item())


def test_is_weights_scale_the_per_token_loss():
    lp, old, adv, mask = inputs()
    weights = torch.tensor([[0.5, 1.0, 7.0], [1.0, 2.0, 0.0]], dtype=torch.float64)
    loss, _ = policy_loss("ppo", lp, old, adv, mask, is_weights=weights)
    assert loss.item() == pytest.approx((0.5 * -1.2 - 0.9 + 1.6 + 2 * 2.0 + 0 * 4.0) / 5)


def test_aggregate_by_hand():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0], [100.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 2 is fully masked: a loss of 0
    assert aggregate(x, mask, "token_mean").item() == pytest.approx((1 + 2 + 3) / 3)
    assert aggregate(x, mask, "token_sum").item() == pytest.approx(1 + 2 + 3)
    assert aggregate(x, mask, "seq_mean_token_mean").item() == pytest.approx(((1 + 2) / 2 + 3 / 1 + 0) / 3)
    assert aggregate(x, mask, "seq_mean_token_sum").item() == pytest.approx(((1 + 2) + 3 + 0) / 3)
    assert aggregate(x, mask, "seq_mean_token_sum_norm", max_len=10).item() == pytest.approx(((1 + 2) + 3) / 3 / 10)
    assert aggregate(x, torch.zeros(3, 3), "token_mean").item() == 0.0
    with pytest.raises(ValueError, match="needs max_len"):
        aggregate(x, mask, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(x, mask, "sum")
    with pytest.raises(ValueError, match="unknown policy loss"):
        policy_loss("grpo", x, x, x[:, 0], mask)
