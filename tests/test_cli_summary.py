"""The lines a training run ends with: what ran, and each held-out change with its paired error."""

from types import SimpleNamespace

from rlvr.orchestration.terminal_run import summary_lines


def _summary(**extra) -> dict:
    return {
        "steps": 10,
        "wall_seconds": 1121.0,
        "engine": "vllm",
        "trainer_ranks": 1,
        "base_format": "nvfp4",
        "lora_rank": 16,
        "eval_before": {"avg@4": 0.135},
        "eval_after": {"avg@4": 0.139, "paired/stderr/avg@4": 0.0138},
    } | extra


def _lines(summary: dict, tmp_path) -> list[str]:
    cfg = SimpleNamespace(eval=SimpleNamespace(k=[1, 4]), run_dir=str(tmp_path))
    return summary_lines(summary, cfg, tmp_path / "report.html", logs=False)


def test_a_whole_run_and_a_resumed_one_say_how_many_steps_they_ran(tmp_path):
    assert _lines(_summary(), tmp_path)[0].startswith("done: 10 steps in 1121 s (engine vllm")
    # resumed after its last step only to evaluate: it ran none
    assert _lines(_summary(resumed_after_step=10), tmp_path)[0].startswith("done: 0 steps after resuming at step 10 in")
    assert _lines(_summary(resumed_after_step=4, stopped_after_step=7), tmp_path)[0].startswith(
        "done: 3 steps after resuming at step 4 in"
    )


def test_the_held_out_change_carries_its_paired_standard_error(tmp_path):
    lines = _lines(_summary(), tmp_path)
    assert "held-out avg@4: 0.135 -> 0.139 (+0.4 points ± 1.4, paired standard error)" in lines
