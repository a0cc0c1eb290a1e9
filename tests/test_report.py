"""The HTML run report: what it shows from a run folder, and that a real browser renders it."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rlvr.eval import SampleRow, flat_eval_metrics, summarize, write_samples
from rlvr.eval.report import write_report
from rlvr.tracking import MetricsLogger, StepTimer

ARTIFACTS = Path(__file__).parent / "artifacts"
DATA_URI_IMG = re.compile(r"<img src=['\"]data:image/png;base64,[A-Za-z0-9+/=]{100,}['\"]")
ALL_PLOTS = {"reward", "response_length", "loss", "entropy", "kl", "clip_fraction", "logprob_gap", "time"}


def _make_run(run_dir: Path, steps: int = 12) -> Path:
    """A small run folder written through the real logger, timer and sample-file writer."""
    rng = np.random.default_rng(0)
    timer = StepTimer()
    with MetricsLogger(run_dir) as logger:
        for step in range(steps):
            with timer("generate"):
                pass
            with timer("train"):
                pass
            metrics = {
                "reward/mean": 0.1 + 0.03 * step + 0.02 * rng.standard_normal(),
                "response/length_mean": 40.0 + step,
                "loss": 1.0 / (1 + step),
                "policy/entropy": 2.0 - 0.05 * step,
                "policy/kl": 0.002 * step,
                "policy/clip_fraction": 0.1,
                "sync/logprob_gap": 0.01 * rng.random(),
                **timer.pop_metrics(),
            }
            if step % 4 == 0:
                rewards = [1, 0, 0, 1] + [0, 0, 0, float(step > 0)]
                evaluated = summarize(
                    ["a"] * 4 + ["b"] * 4, rewards, ["1", "2", "2", "1", None, "x", "x", "7"], None, [1, 4]
                )
                metrics.update(flat_eval_metrics(evaluated, "eval/toy"))
                metrics["time/eval"] = 0.5
            logger.log(step, metrics)
    write_samples(
        run_dir / "eval" / "step_8" / "toy.jsonl",
        [
            SampleRow("a", 1.0, "1", 0, "so the answer is \\boxed{1}", "ok", "1"),
            SampleRow("a", 0.0, "2", 1, "<script>alert('x')</script> \\boxed{2}", "ok", "1"),
            SampleRow("b", 0.0, None, 0, "I do not know", "no_answer", "7"),
            SampleRow("b", 1.0, "7", 1, "\\boxed{7}", "ok", "7"),
        ],
    )
    (run_dir / "config.yaml").write_text("model: tiny-qwen2\nalgorithm:\n  lr: 1.0e-05\n")
    (run_dir / "summary.json").write_text(json.dumps({"steps": steps, "final/reward/mean": 0.43}))
    return run_dir


def test_report_shows_plots_eval_tables_config_and_samples(tmp_path):
    out = write_report(_make_run(tmp_path / "run"))
    page = out.read_text()
    assert out == tmp_path / "run" / "report.html"
    assert len(DATA_URI_IMG.findall(page)) == len(ALL_PLOTS)
    assert {p.stem for p in (tmp_path / "run" / "plots").glob("*.png")} == ALL_PLOTS
    assert "<th>avg@4</th>" in page and "<th>pass@4</th>" in page and "<th>maj@1</th>" in page
    assert "0.500 ± 0.500" in page  # eval/toy/avg@4 at step 0: problems at 0.5 and 0.0
    assert "eval/step_8/toy.jsonl — 2 problems" in page
    assert "<td>a</td><td>1/2</td><td>1</td><td>1</td>" in page  # id, c/n, majority, reference
    assert "lr: 1.0e-05" in page and "final/reward/mean" in page
    assert "&lt;script&gt;" in page and "<script>" not in page  # responses are escaped
    assert "src='http" not in page and 'src="http' not in page  # self-contained


def test_report_plots_only_logged_metrics(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, {"loss": 2.0})
        logger.log(1, {"loss": 1.0})
    page = write_report(tmp_path).read_text()
    assert len(DATA_URI_IMG.findall(page)) == 1
    assert [p.name for p in (tmp_path / "plots").glob("*.png")] == ["loss.png"]
    assert "Evaluation" not in page and "Config" not in page


def test_report_of_an_empty_run_says_so(tmp_path):
    page = write_report(tmp_path).read_text()
    assert "No metrics logged yet." in page and "<img" not in page


def test_a_bad_sample_file_is_reported_not_fatal(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "broken.jsonl").write_text('{"problem_id": "a", "reward": "high", "extracted": null}\n')
    page = write_report(tmp_path).read_text()
    assert "broken.jsonl:1: field &#x27;reward&#x27; must be a finite number" in page


def test_report_needs_an_existing_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="run directory .*nope does not exist"):
        write_report(tmp_path / "nope")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


def _chromium(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Uncaught" in line or "CONSOLE" in line]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    report = write_report(_make_run(tmp_path / "run"))
    url = report.resolve().as_uri()

    dom = _chromium(url, tmp_path / "profile-dom", "--dump-dom")
    assert len(DATA_URI_IMG.findall(dom.stdout)) == len(ALL_PLOTS), "plots missing from the rendered DOM"
    assert "Evaluation" in dom.stdout and "Best samples" in dom.stdout

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "report.png"
    screenshot.unlink(missing_ok=True)
    shot = _chromium(url, tmp_path / "profile-shot", f"--screenshot={screenshot}", "--window-size=1280,1600")
    assert _console_errors(dom.stderr + shot.stderr) == []

    pixels = np.asarray(Image.open(screenshot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (1600, 1280)
    assert pixels.std() > 10, "the screenshot is blank"
    # matplotlib's first line colour (#1f77b4) only appears if the plot images were decoded and drawn.
    plot_blue = (np.abs(pixels - [31, 119, 180]).sum(axis=-1) < 40).sum()
    assert plot_blue > 2000, f"only {plot_blue} plot-coloured pixels: the plots did not render"
