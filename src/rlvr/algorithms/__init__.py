"""RL algorithms as pure functions on tensors: advantages, policy losses, loss aggregation,
KL penalties, off-policy correction, DAPO batch shaping, logprobs and entropy from logits.

No models, no processes: every function takes tensors and returns tensors. Formulas, papers
and the names other frameworks use for the same things: docs/algorithms.md.
"""

from rlvr.algorithms.advantages import ESTIMATORS, advantages
from rlvr.algorithms.dynamic_sampling import (
    groups_to_refill,
    informative_group_mask,
    overlong_filter,
    overlong_penalty,
)
from rlvr.algorithms.kl import KL_KINDS, kl_penalty
from rlvr.algorithms.logits import entropy_from_logits, logprobs_and_entropy, token_logprobs
from rlvr.algorithms.losses import AGGREGATIONS, LOSSES, aggregate, dppo_keep_mask, policy_loss
from rlvr.algorithms.off_policy import (
    LEVELS,
    importance_ratios,
    logprob_gap_metrics,
    masked_is_weights,
    off_policy_keep_mask,
    truncated_is_weights,
)

__all__ = [
    "AGGREGATIONS",
    "ESTIMATORS",
    "KL_KINDS",
    "LEVELS",
    "LOSSES",
    "advantages",
    "aggregate",
    "dppo_keep_mask",
    "entropy_from_logits",
    "groups_to_refill",
    "informative_group_mask",
    "kl_penalty",
    "logprob_gap_metrics",
    "logprobs_and_entropy",
    "masked_is_weights",
    "off_policy_keep_mask",
    "overlong_filter",
    "overlong_penalty",
    "policy_loss",
    "token_logprobs",
    "importance_ratios",
    "truncated_is_weights",
]
