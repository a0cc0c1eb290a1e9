"""Observability: metrics JSONL (+ optional TensorBoard / W&B / MLflow), step timing, progress.

The HTML report reads what these write, and eval's sample files: rlvr.eval.report."""

from rlvr.tracking.metrics_log import MetricsLogger, read_metrics
from rlvr.tracking.timing import StepTimer

__all__ = ["MetricsLogger", "StepTimer", "read_metrics"]
