"""Progress bars: the scoring pool and the engines drive their callbacks to the item count, and
the rich display shows each phase's bar on a terminal and nothing off one."""

from __future__ import annotations

import re

import pytest
from engine_fixtures import build_peaked_model, start_engine
from rich.console import Console
from transformers import AutoTokenizer

from rlvr.records import Problem, Sampling
from rlvr.rewards import ScoringPool
from rlvr.tracking.progress import RunProgress, phase

WIDTH = 120


def terminal() -> Console:
    return Console(record=True, force_terminal=True, width=WIDTH)


def shown(console: Console, description: str, count: str) -> bool:
    """Whether some frame drew the bar `description` at `count` (frames run together in the text)."""
    return re.search(rf"{description}\s+[━╸╺]+\s+{count}\b", console.export_text(clear=False)) is not None


def crash(response, answer):
    import os

    os._exit(3)


@pytest.fixture(scope="module")
def pool():
    with ScoringPool("math", workers=1, timeout_s=1.0) as p:
        yield p


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_peaked_model(tmp_path_factory.mktemp("progress") / "model")


@pytest.fixture(scope="module")
def prompts(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(text) for text in ("abc", "hello world", "12+7=")]


def test_pool_calls_progress_up_to_the_item_count_failures_included(pool):
    responses = [f"\\boxed{{{i}}}" for i in range(9)] + ["x"]
    verifiers = ["math"] * 9 + [f"{__file__}:crash"]  # a dead worker's item is settled too
    calls: list[int] = []
    scores = pool.score(responses, [str(i) for i in range(10)], verifiers, progress=calls.append)
    assert [s.status for s in scores] == ["ok"] * 9 + ["error"]
    assert sum(calls) == 10 and all(c > 0 for c in calls)


def test_bars_show_steps_and_each_phase_on_a_terminal(pool):
    console = terminal()
    with RunProgress(console, steps=3) as progress:
        scores = pool.score(["\\boxed{1}"] * 5, ["1"] * 5, progress=phase(progress, "score", 5))
        phase(progress, "generate", 8)(8)
        progress(1, {"reward/mean": sum(s.reward for s in scores) / 5, "response/length_mean": 9.0, "time/step": 2.0})
    assert shown(console, "RL steps", "1/3")
    assert "reward 1.000  length 9.0  2.00 s/step" in console.export_text(clear=False)
    assert shown(console, "score", "5/5") and shown(console, "generate", "8/8")


def test_a_phase_run_again_reuses_its_line():
    console = terminal()
    with RunProgress(console) as progress:
        phase(progress, "score", 4)(4)
        phase(progress, "score", 6)(2)
    assert shown(console, "score", "2/6")
    assert console.export_text().count("\n") == 1  # every frame was one line: a second bar would add one


STEP = {"reward/mean": 0.5, "response/length_mean": 12.25, "time/step": 1.0}


@pytest.mark.parametrize("is_terminal, enabled", [(False, True), (True, False), (False, False)])
def test_no_bars_when_not_a_terminal_or_disabled(is_terminal, enabled):
    console = Console(record=True, force_terminal=is_terminal, width=WIDTH)
    with RunProgress(console, enabled=enabled, steps=20) as progress:
        assert phase(progress, "score", 3) is None  # engines and the pool then skip their callbacks
        for step in range(1, 21):
            progress(step, STEP)
    lines = console.export_text().splitlines()
    if is_terminal or not enabled:
        assert lines == []
    else:  # a CI log or a file: a plain line every tenth of the run, no bar frames
        assert lines == [f"step {s}/20  reward 0.500  length 12.2  1.00 s/step" for s in range(2, 21, 2)]
    assert phase(None, "score", 3) is None
    assert phase(lambda step, metrics: None, "score", 3) is None  # a plain step callback has no phase bars


def test_hf_engine_and_eval_drive_the_eval_bars(model_dir, prompts, pool):
    from rlvr.eval.runner import evaluate

    with start_engine("hf", model_dir, hf_batch_size=4) as engine:
        calls: list[int] = []
        engine.generate(prompts, 3, Sampling(temperature=1.0, max_tokens=4, seed=0), progress=calls.append)
        assert calls == [4, 4, 1]  # one call per batch of rows
        console = terminal()
        problems = [Problem(id=str(i), question="q", answer="1") for i in range(len(prompts))]
        with RunProgress(console) as progress:
            evaluate(
                engine,
                pool,
                problems,
                prompts,
                n=2,
                ks=[1, 2],
                sampling=Sampling(max_tokens=4, seed=0),
                progress=progress,
            )
    assert shown(console, "eval generate", "6/6") and shown(console, "eval score", "6/6")


@pytest.mark.slow
def test_vllm_engine_reports_each_finished_prompts_samples(model_dir, prompts, capfd):
    with start_engine("vllm", model_dir, max_model_len=256, kv_cache_gb=1) as engine:
        capfd.readouterr()
        calls: list[int] = []
        rollouts = engine.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=6, seed=1), progress=calls.append)
        assert calls == [4, 4, 4] and len(rollouts) == 12
        assert "Processed prompts" not in "".join(capfd.readouterr())  # vLLM's own tqdm draws nothing
