"""Advantages, the policy loss and the off-policy corrections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlvr.config.base import Section


class OverlongPenaltyConfig(Section):
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward: 0 up to
    max_tokens - buffer tokens, then falling linearly to -max_penalty at max_tokens."""

    buffer: int = Field(
        ..., gt=0, description="L_cache: the soft zone's length in tokens, before rollout.sampling.max_tokens"
    )
    max_penalty: float = Field(1.0, gt=0, description="the penalty at max_tokens and beyond (DAPO: 1)")


class RatioBand(Section):
    """A band [low, high] on the ratio pi_old / pi_sampler, taken at a level (the fields: its subclasses)."""

    @model_validator(mode="after")
    def _a_band(self) -> RatioBand:
        if self.low >= self.high:
            raise ValueError(f"low={self.low} must be below high={self.high}")
        return self


class MaskedISConfig(RatioBand):
    """Masked importance sampling (rlvr.algorithms.masked_is_weights): w = pi_old / pi_sampler where
    low <= w <= high, 0 outside, so an out-of-band token (or response) gets no gradient but still
    counts in the denominator. The defaults are IcePop's (Ling Team 2025, Ring-1T, arXiv:2510.18855:
    alpha 0.5, beta 5; verl's decoupled_token_icepop). level sequence, low 0, high 3 is TRL's
    vllm_importance_sampling_mode=sequence_mask with its defaults."""

    level: Literal["token", "sequence", "geometric"] = Field(
        "token",
        description="where the ratio is taken: per token (IcePop), per response (product) or its geometric mean",
    )
    low: float = Field(0.5, ge=0, description="weights below it are zeroed (IcePop's alpha: 0.5; 0: no lower bound)")
    high: float = Field(5.0, gt=0, description="weights above it are zeroed (IcePop's beta: 5)")


class RejectionConfig(RatioBand):
    """Rejection (rlvr.algorithms.off_policy_keep_mask): tokens, or whole responses, whose ratio
    pi_old / pi_sampler leaves [low, high] are taken out of the loss mask (no gradient, KL term
    included; the update's denominator still counts them). The defaults are verl's geometric
    rejection (Geo-RS, RolloutCorrectionConfig.decoupled_geo_rs: rollout_rs=seq_mean_k1,
    0.999_1.001): a response goes when its per-token geometric-mean ratio is off by more than 0.1%.
    level sequence with low 0.5, high 2 is verl's decoupled_seq_is_rs rejection; with tis_cap set as
    well, either is sequence-masked TIS."""

    level: Literal["token", "sequence", "geometric"] = Field(
        "geometric",
        description="what is rejected: a token by its own ratio, or a whole response by its ratio's "
        "product (sequence) or geometric mean (geometric)",
    )
    low: float = Field(0.999, ge=0, description="ratios below it are rejected (verl Geo-RS: 0.999; 0: no lower bound)")
    high: float = Field(1.001, gt=0, description="ratios above it are rejected (verl Geo-RS: 1.001)")


class AlgorithmConfig(Section):
    """The policy-gradient algorithm (formulas and papers: rlvr.algorithms, docs/algorithms.md)."""

    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"] = Field(
        "grpo",
        description="advantage estimator: grpo (Shao et al. 2024), dr_grpo (Liu et al. 2025), "
        "rloo (Ahmadian et al. 2024), reinforce_pp (REINFORCE++, Hu 2025: rewards whitened over the batch's tokens), "
        "reinforce_pp_baseline (the same after a group-mean baseline)",
    )
    std_normalize: bool = Field(
        True, description="grpo: divide by the group's reward std (false: Dr. GRPO's centring only)"
    )
    loss: Literal["ppo", "gspo", "cispo", "sapo", "dppo_tv", "dppo_kl"] = Field(
        "ppo",
        description="policy loss: ppo clip (Schulman et al. 2017), gspo sequence ratio (Zheng et al. 2025), "
        "cispo clipped IS weight (MiniMax-M1, 2025), sapo soft gate instead of the clip (Gao et al. 2025), "
        "dppo_tv / dppo_kl a divergence mask instead of the clip (DPPO, Qi et al. 2026)",
    )
    agg: Literal["token_mean", "token_sum", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = (
        Field(
            "token_mean",
            description="loss aggregation: token_mean (DAPO), token_sum (sum over tokens, no normalisation; "
            "verl's token-sum), seq_mean_token_mean (GRPO paper), seq_mean_token_sum, "
            "seq_mean_token_sum_norm (Dr. GRPO: / max_tokens)",
        )
    )
    clip_low: float = Field(0.2, ge=0, description="ratio clip below 1: 1 - clip_low (PPO)")
    clip_high: float = Field(
        0.2, ge=0, description="ratio clip above 1: 1 + clip_high; above clip_low is DAPO's clip-higher"
    )
    dual_clip: float | None = Field(
        None, description="dual-clip bound c > 1 on negative-advantage tokens (Ye et al. 2020; verl's clip_ratio_c)"
    )
    sapo_tau_pos: float = Field(
        1.0, gt=0, description="sapo: gate temperature on tokens with advantage > 0 (Gao et al. 2025, SAPO: 1.0)"
    )
    sapo_tau_neg: float = Field(
        1.05, gt=0, description="sapo: gate temperature on tokens with advantage <= 0 (Gao et al. 2025, SAPO: 1.05)"
    )
    dppo_delta: float | None = Field(
        None,
        gt=0,
        description="dppo_tv / dppo_kl: the threshold on the binary TV / KL divergence between pi and "
        "pi_old; null: the authors' (verl's DPPO example: 0.15 for dppo_tv, 0.05 for dppo_kl), written into the "
        "run's config",
    )
    kl: Literal["k1", "k2", "k3", "k3+"] | None = Field(
        None,
        description="KL estimator against the frozen base, the adapter disabled (Schulman 2020); "
        "k3+: k3's value with k2's gradient, the unbiased gradient of KL(pi || base) (verl's k3+); null: no KL term",
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL term in the loss")
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="truncated importance sampling, weights min(pi_old / pi_sampler, cap); "
        "null: 2.0 when rollout.mode is not sync, else off",
    )
    tis_level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="where the IS ratio is taken: per token, per sequence (product) or its geometric mean"
    )
    masked_is: MaskedISConfig | None = Field(
        None,
        description="masked importance sampling instead of tis_cap's truncated weights (IcePop at token level); "
        "null: off",
    )
    rejection: RejectionConfig | None = Field(
        None,
        description="drop tokens or whole responses too far off policy from the loss (geometric rejection by "
        "default); combines with tis_cap or masked_is. null: off",
    )
    overlong_filter: bool = Field(
        False,
        description="mask responses cut off at max_tokens out of the loss (DAPO's overlong filtering, Yu et al. 2025)",
    )
    overlong_penalty: OverlongPenaltyConfig | None = Field(
        None, description="DAPO's soft length penalty on the reward (null: none)"
    )

    @property
    def kl_term(self) -> bool:
        """Whether the loss has a KL term: the one part of its gradient that does not scale with the advantages."""
        return self.kl is not None and self.kl_coef > 0

    @model_validator(mode="after")
    def _dppo_threshold(self) -> AlgorithmConfig:
        if self.loss.startswith("dppo") and self.dppo_delta is None:
            self.dppo_delta = 0.15 if self.loss == "dppo_tv" else 0.05
        return self
