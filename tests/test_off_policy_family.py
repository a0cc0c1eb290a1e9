"""The off-policy correction family: masked IS (IcePop), rejection (geometric, sequence, token) and
sequence-masked TIS, against their papers' formulas worked out by hand, against verl's own code,
and as the trainer applies them.

verl's functions run as installed (verl 0.9.1, `pip install --no-deps verl==0.9.1
tensordict==0.15.3 pyvers==0.2.3 codetiming==1.4.0`: the one module, rollout_corr_helper, imports
without a GPU); the comparisons skip where it is absent. TRL 1.16's sequence_mask mode is inline
in GRPOTrainer._generate_and_score_completions, which cannot run without a model and a
generation: it is compared with its formula (TRL's docstring: a sequence's ratio outside
[C_min, C_max] sets its weights to 0).
"""

import math

import pytest
import torch

from rlvr.algorithms import masked_is_weights, off_policy_keep_mask, truncated_is_weights
from rlvr.config import AlgorithmConfig, MaskedISConfig, RejectionConfig


def logs(*ratios):
    return [math.log(r) for r in ratios]


# Sampler logprobs fixed; the trainer's differ by the log of each token's ratio pi_old / pi_sampler.
# Row 0: ratios (0.4, 1, 4, 6)          IcePop [0.5, 5] keeps the middle two
# Row 1: ratios (2, 1.5, pad, pad)      product 3, geometric mean sqrt(3)
# Row 2: ratios (1.0005, 0.9995, 1.0004, pad)   geometric mean within 0.1% of 1
SAMPLER = torch.tensor([[-1.0, -2.0, -3.0, -0.5], [-0.7, -1.1, 9.0, 9.0], [-2.0, -0.3, -0.9, 9.0]], dtype=torch.float64)
LOG_RATIO = torch.tensor(
    [logs(0.4, 1, 4, 6), logs(2, 1.5) + [0.0, 0.0], logs(1.0005, 0.9995, 1.0004) + [0.0]], dtype=torch.float64
)
TRAINER = SAMPLER + LOG_RATIO
TRAINER[1, 2:] = -50.0  # padded positions hold junk
TRAINER[2, 3] = 40.0
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]).bool()


def test_icepop_zeroes_token_weights_outside_its_band():
    w = masked_is_weights(TRAINER, SAMPLER, MASK, low=0.5, high=5.0)  # IcePop's alpha, beta
    assert w[0].tolist() == pytest.approx([0.0, 1.0, 4.0, 0.0])
    assert w[1, :2].tolist() == pytest.approx([2.0, 1.5])
    assert w[2, :3].tolist() == pytest.approx([1.0005, 0.9995, 1.0004])
    assert torch.isfinite(w).all()


def test_sequence_masked_is_is_trls_sequence_mask():
    # TRL's defaults: C_max 3, no lower bound; row 0's product 0.4 * 4 * 6 = 9.6 leaves the band
    w = masked_is_weights(TRAINER, SAMPLER, MASK, low=0.0, high=3.0, level="sequence")
    assert w[0].tolist() == [0.0] * 4
    assert w[1, :2].tolist() == pytest.approx([3.0, 3.0])  # 2 * 1.5, on the edge: kept
    assert w[2, :3].tolist() == pytest.approx([1.0005 * 0.9995 * 1.0004] * 3)
    strict = masked_is_weights(TRAINER, SAMPLER, MASK, low=0.0, high=2.9, level="sequence")
    assert strict[1, :2].tolist() == [0.0, 0.0]
    assert torch.isfinite(w).all() and torch.isfinite(strict).all()


def test_geometric_rejection_drops_whole_responses():
    keep = off_policy_keep_mask(TRAINER, SAMPLER, MASK, low=0.999, high=1.001, level="geometric")  # verl's Geo-RS
    # row 0: geometric mean (0.4*1*4*6)^(1/4) = 1.57; row 1: sqrt(3) = 1.73; row 2: 1.00013
    assert keep.tolist() == [[False] * 4, [False] * 4, [True, True, True, False]]
    token = off_policy_keep_mask(TRAINER, SAMPLER, MASK, low=0.5, high=5.0, level="token")
    assert token[0].tolist() == [False, True, True, False]


def test_sequence_masked_tis():
    """TIS weights on the responses a sequence-level band keeps (verl's decoupled_seq_is_rs: cap 2,
    band [0.5, 2] on the product of ratios)."""
    weights = truncated_is_weights(TRAINER, SAMPLER, MASK, cap=2.0, level="sequence")
    keep = off_policy_keep_mask(TRAINER, SAMPLER, MASK, low=0.5, high=2.0, level="sequence")
    assert keep.tolist() == [[False] * 4, [False] * 4, [True, True, True, False]]
    assert weights[2, :3].tolist() == pytest.approx([1.0005 * 0.9995 * 1.0004] * 3)
    assert weights[1, :2].tolist() == pytest.approx([2.0, 2.0])  # truncated, though rejected here


def test_masked_is_band_must_be_a_band():
    with pytest.raises(ValueError, match="0 <= low < high"):
        masked_is_weights(TRAINER, SAMPLER, MASK, low=2.0, high=1.0)


# ------------------------------------------------------------------------------- the trainer


def trainer_loss(algorithm: AlgorithmConfig, agg: str = "token_mean", old: torch.Tensor | None = None):
    """The trainer's own loss (rlvr.training.rank_loss.micro_batch_loss) on the tensors above, with
    the current policy = TRAINER and pi_old = `old` (default: TRAINER, one update); returns the
    loss, d loss / d logprobs, the IS weights and the kept mask."""
    from rlvr.training.rank_loss import micro_batch_loss

    lp = TRAINER.clone().requires_grad_()
    advantages = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    loss, _, is_weights, kept = micro_batch_loss(
        algorithm.model_copy(update={"agg": agg}),
        lp,
        lp.detach() if old is None else old,
        SAMPLER,
        advantages,
        MASK,
        4,
        reference=lambda: pytest.fail("read for the KL term, which these algorithms leave off"),
    )
    loss.backward()
    return loss, lp.grad, is_weights, kept


def test_trainer_applies_icepop_per_token():
    _, grad, weights, kept = trainer_loss(AlgorithmConfig(masked_is=MaskedISConfig()))
    assert torch.equal(kept, MASK)  # out-of-band tokens stay in the denominator
    assert grad[0].tolist()[0] == 0.0 and grad[0].tolist()[3] == 0.0
    # on-policy ratio 1: d(-w A rho)/d lp = -w A / (valid tokens: 9)
    assert grad[0, 1:3].tolist() == pytest.approx([-1.0 / 9, -4.0 / 9])
    assert grad[1, :2].tolist() == pytest.approx([2.0 / 9, 1.5 / 9])


def test_trainer_rejects_responses_and_keeps_the_denominator():
    _, grad, weights, kept = trainer_loss(AlgorithmConfig(rejection=RejectionConfig()))  # Geo-RS defaults
    assert weights is None
    assert kept.tolist() == [[False] * 4, [False] * 4, [True, True, True, False]]
    assert grad[:2].abs().sum().item() == 0.0
    # the micro-batch's own token mean runs over the 3 kept tokens (the update's share then
    # multiplies by kept / all tokens: rlvr.training.rank_loss.update_share)
    assert grad[2, :3].tolist() == pytest.approx([-0.5 / 3] * 3)
    assert grad[2, 3].item() == 0.0


def test_trainer_sequence_masked_tis():
    _, grad, weights, kept = trainer_loss(
        AlgorithmConfig(
            tis_cap=2.0, tis_level="sequence", rejection=RejectionConfig(level="sequence", low=0.5, high=2.0)
        ),
        agg="seq_mean_token_mean",
    )
    assert kept.tolist() == [[False] * 4, [False] * 4, [True, True, True, False]]
    w = 1.0005 * 0.9995 * 1.0004
    assert grad[2, :3].tolist() == pytest.approx([-0.5 * w / 3 / 3] * 3)  # / 3 tokens / 3 rows
    assert grad[:2].abs().sum().item() == 0.0


def test_bad_values_are_one_line_errors_exit_2():
    import subprocess
    import sys

    def train(*overrides):
        return subprocess.run(
            [sys.executable, "-m", "rlvr.cli", "train", "configs/demo.yaml", "--dry-run", *overrides],
            capture_output=True,
            text=True,
            timeout=120,
        )

    for overrides, named in [
        (["algorithm.masked_is.low=6"], "algorithm.masked_is: low=6.0 must be below high=5.0"),
        (["algorithm.rejection.high=0"], "algorithm.rejection.high: Input should be greater than 0"),
        (["algorithm.rejection.level=seq"], "algorithm.rejection.level: Input should be 'token', 'sequence' or"),
        (["algorithm.masked_is={}", "algorithm.tis_cap=2"], "algorithm.tis_cap=2.0 and algorithm.masked_is both"),
    ]:
        done = train(*overrides)
        errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and len(errors) == 1 and named in errors[0], (overrides, done.stdout, done.stderr)
    ok = train("algorithm.masked_is={}", "rollout.max_staleness=1")
    assert ok.returncode == 0 and "tis_cap: null" in ok.stdout  # masked IS replaces the automatic TIS


# ------------------------------------------------------------------------------- verl's own code


@pytest.fixture(scope="module")
def verl_corr():
    return pytest.importorskip("verl.trainer.ppo.rollout_corr_helper", reason="verl not installed (see the docstring)")


def random_logprobs(seed: int, spread: float):
    gen = torch.Generator().manual_seed(seed)
    sampler = -3.0 * torch.rand(8, 12, generator=gen, dtype=torch.float64)
    trainer = sampler + spread * torch.randn(8, 12, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([12, 9, 1, 5, 12, 3, 7, 10])
    mask = torch.arange(12) < lengths[:, None]
    return trainer, sampler, mask


@pytest.mark.parametrize("seed", range(4))
def test_masked_is_matches_verl_icepop(verl_corr, seed):
    trainer, sampler, mask = random_logprobs(seed, spread=0.6)
    zeroed = 0
    for level, (low, high) in [("token", (0.5, 5.0)), ("token", (0.8, 1.3)), ("sequence", (0.2, 4.0))]:
        theirs, _ = verl_corr.compute_rollout_correction_weights(
            trainer - sampler, mask.double(), rollout_is=level, rollout_is_threshold=f"{low}_{high}"
        )
        ours = masked_is_weights(trainer, sampler, mask, low=low, high=high, level=level)
        assert torch.where(mask, ours - theirs, 0.0).abs().max().item() < 1e-9, (level, low, high)
        zeroed += int((mask & (ours == 0)).sum())
    assert zeroed > 0  # the bands bite


@pytest.mark.parametrize("seed", range(4))
def test_rejection_matches_verl_rollout_rs(verl_corr, seed):
    """verl's k1 options bound -log w, i.e. pi_sampler / pi_old: its "lo_hi" is rlvr's band
    [1 / hi, 1 / lo] on w. Asymmetric bands pin the direction down."""
    trainer, sampler, mask = random_logprobs(seed, spread=0.3)
    rejected = 0
    for level, option in [("token", "token_k1"), ("sequence", "seq_sum_k1"), ("geometric", "seq_mean_k1")]:
        for lo, hi in [(0.7, 1.6), (0.95, 1.02), (0.5, 2.0)]:
            theirs, _ = verl_corr.compute_rollout_rejection_mask(
                trainer - sampler, mask.double(), rollout_rs=option, rollout_rs_threshold=f"{lo}_{hi}"
            )
            ours = off_policy_keep_mask(trainer, sampler, mask, low=1 / hi, high=1 / lo, level=level)
            assert torch.equal(ours, theirs.bool()), (level, lo, hi)
            rejected += int((mask & ~ours).sum())
    assert rejected > 0


@pytest.mark.parametrize("seed", range(3))
def test_sequence_masked_tis_matches_verl_decoupled_seq_is_rs(verl_corr, seed):
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    preset = RolloutCorrectionConfig.decoupled_seq_is_rs()  # sequence TIS cap 2, seq_sum_k1 "0.5_2.0"
    trainer, sampler, mask = random_logprobs(seed, spread=0.3)
    weights, kept, _ = verl_corr.compute_rollout_correction_and_rejection_mask(
        trainer,
        sampler,
        mask.double(),
        rollout_is=preset.rollout_is,
        rollout_is_threshold=preset.rollout_is_threshold,
        rollout_rs=preset.rollout_rs,
        rollout_rs_threshold=preset.rollout_rs_threshold,
    )
    ours = truncated_is_weights(trainer, sampler, mask, cap=2.0, level="sequence")
    assert torch.where(mask, ours - weights.batch["rollout_is_weights"], 0.0).abs().max().item() < 1e-9
    our_kept = off_policy_keep_mask(trainer, sampler, mask, low=0.5, high=2.0, level="sequence")
    assert torch.equal(our_kept, kept.bool()) and 0 < int(our_kept.any(-1).sum()) < 8


# ------------------------------------------------------------------------------- DPPO


def test_dppo_masks_by_hand():
    """Probabilities p_old -> p of four tokens, advantages +, +, -, -; delta 0.15 (tv), 0.05 (kl)."""
    from rlvr.algorithms import dppo_keep_mask

    p_old = torch.tensor([[0.001, 0.5, 0.9, 0.3]], dtype=torch.float64)
    p = torch.tensor([[0.1, 0.7, 0.7, 0.35]], dtype=torch.float64)  # a 100x ratio on a rare token: tv 0.099
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    tv = dppo_keep_mask(p.log(), p_old.log(), adv, divergence="tv", delta=0.15)
    assert tv.tolist() == [[True, False, False, True]]  # +0.2 with A > 0, -0.2 with A < 0 are masked

    def binary_kl(a, b):
        return a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))

    kl = dppo_keep_mask(p.log(), p_old.log(), adv, divergence="kl", delta=0.05)
    # token 0: D = 0.094 > 0.05 and p rose under A > 0: masked (TV let it through)
    assert binary_kl(0.001, 0.1) > 0.05 and binary_kl(0.5, 0.7) > 0.05 and binary_kl(0.9, 0.7) > 0.05
    assert kl.tolist() == [[False, False, False, True]]
    # the mask only stops moves that widen the gap: p fell with A > 0 is kept however far
    assert dppo_keep_mask(p_old.log(), p.log(), adv, divergence="kl", delta=0.05)[0, :2].tolist() == [True, True]


@pytest.fixture(scope="module")
def verl_core():
    return pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl not installed (see the docstring)")


@pytest.mark.parametrize("divergence, delta", [("tv", 0.15), ("kl", 0.05), ("tv", 0.05)])
@pytest.mark.parametrize("seed", range(3))
def test_dppo_loss_matches_verl(verl_core, divergence, delta, seed):
    from verl.workers.config.actor import ActorConfig

    from rlvr.algorithms import policy_loss

    # the authors' example: symmetric delta, clip_ratio_c 10000 (no truncation of the ratio)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=delta,
        clip_ratio_low=delta,
        clip_ratio_high=delta,
        clip_ratio_c=10000.0,
    )
    gen = torch.Generator().manual_seed(seed)
    old = -2.5 * torch.rand(8, 12, generator=gen, dtype=torch.float64)
    new = old + 0.5 * torch.randn(8, 12, generator=gen, dtype=torch.float64)
    adv = torch.randn(8, generator=gen, dtype=torch.float64)
    mask = torch.arange(12) < torch.tensor([12, 9, 1, 5, 12, 3, 7, 10])[:, None]
    theirs_lp = new.clone().requires_grad_()
    loss_fn = getattr(verl_core, f"compute_policy_loss_dppo_{divergence}")
    theirs, their_metrics = loss_fn(old, theirs_lp, adv[:, None].expand(8, 12), mask.double(), "token-mean", config)
    theirs.backward()
    ours_lp = new.clone().requires_grad_()
    ours, metrics = policy_loss(
        f"dppo_{divergence}", ours_lp, old, adv, mask, clip_low=0.2, clip_high=0.2, dppo_delta=delta, agg="token_mean"
    )
    ours.backward()
    assert abs(ours.item() - theirs.item()) < 1e-9
    assert torch.where(mask, ours_lp.grad - theirs_lp.grad, 0.0).abs().max().item() < 1e-9
    assert metrics["clip_fraction"].item() == pytest.approx(their_metrics["actor/pg_clipfrac"], abs=1e-6)
    assert 0 < metrics["clip_fraction"].item() < 1  # the mask bites, and not everywhere


def test_dppo_threshold_defaults_to_the_authors():
    assert AlgorithmConfig(loss="dppo_tv").dppo_delta == 0.15
    assert AlgorithmConfig(loss="dppo_kl").dppo_delta == 0.05
    assert AlgorithmConfig(loss="dppo_kl", dppo_delta=0.1).dppo_delta == 0.1
    assert AlgorithmConfig().dppo_delta is None


def test_trainer_applies_dppo_against_pi_old():
    # pi_old = the sampler, so the trainer's ratios above are pi / pi_old: some tokens move their
    # probability by more than delta = 0.15 in their advantage's direction, others do not
    config = AlgorithmConfig(loss="dppo_tv")
    assert config.dppo_delta == 0.15
    old = SAMPLER.clone()
    _, grad, _, _ = trainer_loss(config, old=old)
    p, p_old = TRAINER.exp(), old.exp()
    expected_keep = torch.where(torch.tensor([1.0, -1.0, 0.5])[:, None] > 0, p - p_old <= 0.15, p - p_old >= -0.15)
    assert torch.equal(MASK & (grad != 0), MASK & expected_keep)
    assert (MASK & ~expected_keep).any() and (MASK & expected_keep).any()
