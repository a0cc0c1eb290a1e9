"""Rewards: final-answer extraction, answer equivalence, verifiers, and the sandboxed pool.

`get_verifier(name, **options)` gives a pure `(response, reference) -> Score` function;
`ScoringPool` runs verifiers in worker processes with per-item timeouts (see `pool.py`).
"""

from rlvr.rewards.custom import batched_reward
from rlvr.rewards.pool import ScoringPool
from rlvr.rewards.verifiers import VERIFIERS, get_verifier

__all__ = ["VERIFIERS", "ScoringPool", "batched_reward", "get_verifier"]
