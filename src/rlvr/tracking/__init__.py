"""Observability: metrics JSONL (+ optional TensorBoard / W&B / MLflow), step timing, the HTML report."""

from rlvr.tracking.metrics_log import MetricsLogger, read_metrics
from rlvr.tracking.report import write_report
from rlvr.tracking.timing import StepTimer

__all__ = ["MetricsLogger", "StepTimer", "read_metrics", "write_report"]
