"""metrics.jsonl logging (append, resume, torn lines), the optional backends, step timing."""

import json
import sys
import time

import pytest

from rlvr.tracking import MetricsLogger, StepTimer, read_metrics


def test_log_appends_one_json_line_per_call(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, {"reward/mean": 0.25, "eval/toy/avg@8": 0.5})
        logger.log(1, {"loss": 1.5, "tokens": 120})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 0, "reward/mean": 0.25, "eval/toy/avg@8": 0.5},
        {"step": 1, "loss": 1.5, "tokens": 120},
    ]


def test_array_scalars_are_logged_as_numbers(tmp_path):
    np = pytest.importorskip("numpy")
    with MetricsLogger(tmp_path) as logger:
        logger.log(3, {"a": np.float32(0.5), "b": np.int64(2)})
    assert read_metrics(tmp_path) == [{"step": 3, "a": 0.5, "b": 2}]


def test_resume_appends_and_truncate_after_drops_later_steps(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for step in range(5):
            logger.log(step, {"loss": float(step)})
    # The run crashed after step 4; its last checkpoint holds step 2.
    with MetricsLogger(tmp_path) as logger:
        logger.truncate_after(2)
        logger.log(3, {"loss": 30.0})
    assert [(row["step"], row["loss"]) for row in read_metrics(tmp_path)] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]


def test_truncate_after_drops_a_final_eval_the_resumed_run_does_again(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        logger.log(3, {"loss": 3.0})
        logger.log(3, {"eval_after/avg@8": 0.5})  # killed after this line, before the run's summary
    with MetricsLogger(tmp_path) as logger:
        logger.truncate_after(3, redone="eval_after/")
        logger.log(3, {"eval_after/avg@8": 0.5})
    assert read_metrics(tmp_path) == [{"step": 3, "loss": 3.0}, {"step": 3, "eval_after/avg@8": 0.5}]


def test_a_torn_final_line_is_dropped_before_appending(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "lo')
    assert read_metrics(tmp_path) == [{"step": 0, "loss": 1.0}]
    with MetricsLogger(tmp_path) as logger:
        logger.log(1, {"loss": 0.5})
    assert read_metrics(tmp_path) == [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}]


def test_a_corrupt_middle_line_names_file_and_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        read_metrics(tmp_path)


@pytest.mark.parametrize(
    ("step", "metrics", "error", "message"),
    [
        (0, {"note": "text"}, TypeError, "metric 'note' must be a number, got str"),
        (0, {"flag": True}, TypeError, "metric 'flag' must be a number, got bool"),
        (0, {"step": 3}, ValueError, "'step' is the line's own key"),
        (-1, {"loss": 1.0}, ValueError, "step must be a non-negative integer"),
    ],
)
def test_bad_log_calls_are_rejected(tmp_path, step, metrics, error, message):
    with MetricsLogger(tmp_path) as logger, pytest.raises(error, match=message):
        logger.log(step, metrics)
    assert read_metrics(tmp_path) == []


def test_unknown_backend_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown metrics backend 'neptune'; known: tensorboard, wandb, mlflow"):
        MetricsLogger(tmp_path, ["neptune"])


@pytest.mark.parametrize("backend", ["tensorboard", "wandb", "mlflow"])
def test_a_missing_backend_package_gives_a_one_line_error(tmp_path, monkeypatch, backend):
    monkeypatch.setitem(sys.modules, backend, None)  # makes `import <backend>` fail
    with pytest.raises(ImportError, match=rf"metrics backend '{backend}' needs the Python package '{backend}'"):
        MetricsLogger(tmp_path, [backend])


def test_tensorboard_backend_mirrors_scalars_and_purges_on_resume(tmp_path):
    pytest.importorskip("tensorboard", reason="optional extra rlvr[tracking]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, ["tensorboard"], config={"lr": 1e-5}) as logger:
        for step in range(4):
            logger.log(step, {"reward/mean": step / 10})
    with MetricsLogger(tmp_path, ["tensorboard"]) as logger:
        logger.truncate_after(1)
        logger.log(2, {"reward/mean": 0.9})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("reward/mean")] == [(0, 0.0), (1, 0.1), (2, 0.9)]


@pytest.mark.slow  # wandb starts its wandb-core service process (~10 s here)
def test_wandb_backend_writes_an_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="optional extra rlvr[tracking]")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with MetricsLogger(tmp_path, ["wandb"], config={"lr": 1e-5}) as logger:
        logger.log(0, {"eval/toy/pass@4": 0.5})
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


@pytest.mark.slow  # importing mlflow takes 3-20 s of CPU here
def test_mlflow_backend_logs_to_a_local_store_with_legal_names(tmp_path):
    pytest.importorskip("mlflow", reason="optional extra rlvr[tracking]")
    from mlflow.tracking import MlflowClient

    with MetricsLogger(tmp_path, ["mlflow"], config={"lr": 1e-5}) as logger:
        logger.log(0, {"eval/toy/pass@4": 0.5})
        logger.log(1, {"eval/toy/pass@4": 0.75})
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("rlvr").experiment_id])
    history = client.get_metric_history(run.info.run_id, "eval/toy/pass_at_4")
    assert [(m.step, m.value) for m in history] == [(0, 0.5), (1, 0.75)]
    assert run.info.status == "FINISHED"


def test_step_timer_adds_up_sections_and_resets():
    timer = StepTimer()
    with timer("generate"):
        time.sleep(0.01)
    with timer("train"):
        pass
    with timer("generate"):
        time.sleep(0.01)
    metrics = timer.pop_metrics()
    assert set(metrics) == {"time/generate", "time/train"}
    assert metrics["time/generate"] >= 0.02 > metrics["time/train"]
    assert timer.pop_metrics() == {}


def test_step_timer_refuses_nested_sections_and_survives_errors():
    timer = StepTimer()
    with pytest.raises(RuntimeError, match="'score' started inside 'generate'"), timer("generate"), timer("score"):
        pass
    with pytest.raises(KeyError), timer("train"):
        raise KeyError("boom")
    assert set(timer.pop_metrics()) == {"time/generate", "time/train"}
