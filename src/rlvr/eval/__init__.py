"""Evaluation: avg@k, unbiased pass@k, maj@k with standard errors, and per-sample files.

The eval loop over an engine is `rlvr.eval.runner.evaluate`; it is not imported here so
that re-scoring a sample file and writing a report do not pull in torch.
"""

from rlvr.eval.metrics import flat_eval_metrics, pass_at_k, summarize
from rlvr.eval.rollouts_file import SampleRow, metrics_from_rollouts, read_samples, write_samples

__all__ = [
    "SampleRow",
    "flat_eval_metrics",
    "metrics_from_rollouts",
    "pass_at_k",
    "read_samples",
    "summarize",
    "write_samples",
]
