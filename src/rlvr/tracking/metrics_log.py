"""Run metrics: one JSON line per log call in run_dir/metrics.jsonl, mirrored to optional backends.

The JSONL file is the record every other tool reads (the report, resume, comparisons); the
backends are views of it for people who already use them:

    tensorboard  event files under run_dir/tensorboard        (package `tensorboard`)
    wandb        an offline run under run_dir/wandb, no network (package `wandb`;
                 `wandb sync` uploads it later if wanted)
    mlflow       a local file store under run_dir/mlruns        (package `mlflow` or
                 `mlflow-skinny`; `mlflow ui --backend-store-uri run_dir/mlruns`)

Each backend's package is imported only when a config asks for it.

A line is {"step": int, "<metric>": number, ...} with flat metric names such as
"reward/mean" or "eval/aime24/avg@8". Each line goes out in a single write() on a file opened
with O_APPEND, so a crash leaves at most one torn final line, which the reader and the next
logger drop.

Resume: a resumed run appends to the same file; `truncate_after(step)` first drops the lines
of steps the checkpoint does not contain (logged after it was saved), and TensorBoard purges
its events past that step. W&B and MLflow get a new run per logger, so nothing to purge there.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


def _import_backend_package(backend: str, module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"metrics backend {backend!r} needs the Python package {package!r}: pip install {package} (or rlvr[tracking])"
        ) from None


class _TensorBoard:
    def __init__(self, run_dir: Path, config: dict | None):
        _import_backend_package("tensorboard", "tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self._open = SummaryWriter
        self._log_dir = str(run_dir / "tensorboard")
        self._writer = self._open(self._log_dir)
        if config is not None:
            self._writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def truncate_after(self, step: int) -> None:
        # SummaryWriter discards the events at and past purge_step when it opens its file.
        self._writer.close()
        self._writer = self._open(self._log_dir, purge_step=step + 1)

    def close(self) -> None:
        self._writer.close()


class _Wandb:
    def __init__(self, run_dir: Path, config: dict | None):
        wandb = _import_backend_package("wandb", "wandb", "wandb")
        self._run = wandb.init(
            project="rlvr",
            name=run_dir.name,
            dir=str(run_dir),
            mode="offline",
            config=config,
            reinit="create_new",  # several loggers in one process each get their own run
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def truncate_after(self, step: int) -> None:
        pass  # a fresh offline run: it holds no steps past `step`

    def close(self) -> None:
        self._run.finish()


class _Mlflow:
    def __init__(self, run_dir: Path, config: dict | None):
        _import_backend_package("mlflow", "mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        # MLflow 3 keeps the file store (a plain folder, nothing to serve or migrate, readable
        # by MLflow 2 too) behind an opt-in; the database store would need SQLAlchemy.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # A client bound to this run's own store, not mlflow's process-global tracking URI.
        self._client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
        experiment = self._client.get_experiment_by_name("rlvr")
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment("rlvr")
        self._run_id = self._client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        if config is not None:
            self._client.log_dict(self._run_id, config, "config.json")

    @staticmethod
    def metric_name(key: str) -> str:
        """MLflow names allow only [/\\w.\\- ]: "eval/aime/pass@8" -> "eval/aime/pass_at_8"."""
        return re.sub(r"[^/\w.\- ]", "_", key.replace("@", "_at_"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        timestamp_ms = int(1000 * time.time())
        batch = [Metric(self.metric_name(k), v, timestamp_ms, step) for k, v in metrics.items()]
        self._client.log_batch(self._run_id, metrics=batch)

    def truncate_after(self, step: int) -> None:
        pass  # a new MLflow run per logger: it holds no steps past `step`

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


BACKENDS = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow}


def _as_number(key, value):
    if not isinstance(key, str):
        raise TypeError(f"metric names must be strings, got {key!r}")
    if hasattr(value, "item"):  # a torch or numpy scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}")
    return value


def _parse_lines(path: Path) -> list[dict]:
    """The complete lines of a metrics file; a torn final line (no newline) is left out."""
    if not path.exists():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]  # the last piece is "" or torn
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return rows


def read_metrics(run_dir: str | Path) -> list[dict]:
    """All logged lines of a run, in file order: [{"step": int, "<metric>": number, ...}]."""
    return _parse_lines(Path(run_dir) / METRICS_FILE)


class MetricsLogger:
    """Appends metrics to run_dir/metrics.jsonl and mirrors them to the named backends."""

    def __init__(self, run_dir: str | Path, backends: Sequence[str] = (), config: dict | None = None):
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown metrics backend {unknown[0]!r}; known: {', '.join(BACKENDS)}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        # Backends first: a missing package then fails before any file is opened.
        self._backends = [BACKENDS[name](self.run_dir, config) for name in dict.fromkeys(backends)]
        self._drop_torn_final_line()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _drop_torn_final_line(self) -> None:
        # Appending after a torn line would glue the next line onto it and corrupt both.
        if self.path.exists() and self.path.stat().st_size:
            data = self.path.read_bytes()
            if not data.endswith(b"\n"):
                with self.path.open("r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)

    def log(self, step: int, metrics: dict) -> None:
        """Append {"step": step, **metrics} as one line and send the metrics to each backend."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        if "step" in metrics:
            raise ValueError("'step' is the line's own key; pass it as the step argument, not as a metric")
        clean = {key: _as_number(key, value) for key, value in metrics.items()}
        line = (json.dumps({"step": step, **clean}) + "\n").encode("utf-8")
        written = os.write(self._fd, line)
        if written != len(line):
            raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
        for backend in self._backends:
            backend.log(step, clean)

    def truncate_after(self, step: int, redone: str | None = None) -> None:
        """Drop every logged line with a step greater than `step` (resume from a checkpoint), and
        at `step` the lines with a metric under the prefix `redone` (what the resumed run logs
        there again: a final evaluation that a kill interrupted, or that ran before it)."""
        kept = [
            row
            for row in _parse_lines(self.path)
            if row["step"] < step or (row["step"] == step and not (redone and any(k.startswith(redone) for k in row)))
        ]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
        os.close(self._fd)
        os.replace(tmp, self.path)  # readers see the old file or the new one, never half of it
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for backend in self._backends:
            backend.truncate_after(step)

    def close(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        for backend in self._backends:
            backend.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
