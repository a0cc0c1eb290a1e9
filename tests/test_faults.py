"""Faults on the real stack: steps whose loss goes non-finite, and an engine process killed mid-run."""

import time

import psutil
import pytest
from run_fixtures import DIGIT_SHARE, small_config, start_training, step_rows

from rlvr.checkpoint.store import verify

# A sampling temperature so small that the trainer's logits / T overflow float32: vLLM samples
# greedily below 1e-5, but the trainer scores every token inf - inf = NaN, so each step's loss
# and gradient norm are NaN and the ranks skip the optimizer step. (The sync probe and eval score
# at temperature 1, so the run gets as far as the skip limit.)
OVERFLOWING_SAMPLING = {"temperature": 1e-40, "max_tokens": 48}


@pytest.mark.slow
def test_non_finite_steps_are_skipped_logged_and_stop_the_run_after_max_consecutive_skips(tmp_path):
    path = small_config(
        tmp_path,
        "run",
        steps=4,
        rollout={"sampling": OVERFLOWING_SAMPLING},
        trainer={"max_consecutive_skips": 2},
        checkpoint={"every": 1, "keep": 3},
    )
    run = start_training(path)
    out, _ = run.communicate(timeout=900)
    assert run.returncode != 0
    assert "trainer.max_consecutive_skips=2: steps 1-2 had a non-finite loss or gradient" in out, out[-3000:]
    rows = step_rows(tmp_path / "run")
    assert [(row["step"], row["skipped"]) for row in rows] == [(1, 1.0), (2, 1.0)]
    # step 1 checkpointed as usual; the stop at step 2 writes nothing and leaves it intact
    checkpoints = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert [c.name for c in checkpoints] == ["step_000001"] and verify(checkpoints[0]) is None


@pytest.mark.slow
def test_an_engine_core_killed_mid_run_is_restarted_and_the_run_completes(tmp_path):
    path = small_config(tmp_path, "run", steps=3, reward=DIGIT_SHARE, engine={"in_process": False, "max_restarts": 1})
    run = start_training(path)
    deadline = time.time() + 600
    while time.time() < deadline and run.poll() is None and not step_rows(tmp_path / "run"):
        time.sleep(0.2)
    assert run.poll() is None, run.communicate()[0][-3000:]  # still running after step 1
    cores = _engine_cores(run.pid)
    assert len(cores) == 1, [c.cmdline() for c in cores]
    cores[0].kill()  # SIGKILL, between step 1 and step 2's generation
    out, _ = run.communicate(timeout=900)
    assert run.returncode == 0, out[-3000:]
    assert "restarting the engine (1/1) and retrying" in out
    rows = step_rows(tmp_path / "run")
    assert [(row["step"], row["engine/restarts"]) for row in rows] == [(1, 0), (2, 1), (3, 1)]
    # the new engine serves the trained adapter: its rollouts' own logprobs agree, and its first push is probed
    assert all(row["sync/sampler_trainer_gap"] <= 1e-3 for row in rows)
    assert [("sync/logprob_gap" in row) for row in rows] == [False, True, True]  # step 3's: the after-evaluation's
    assert rows[1]["sync/logprob_gap"] <= 1e-3


def _engine_cores(pid: int) -> list[psutil.Process]:
    """vLLM's engine-core processes under `pid` (vLLM titles them VLLM::EngineCore)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() + " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:  # a short-lived helper process that is already gone
            pass
    return found


def test_tensors_packed_for_a_separate_engine_process_come_back_exact():
    import torch

    from rlvr.engines.vllm_worker import as_tensor, packed

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tensor = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
        back = as_tensor(packed(tensor.t()))  # a non-contiguous view too
        assert back.dtype == dtype and torch.equal(back, tensor.t())
    assert as_tensor(tensor) is tensor  # in-process tensors pass through
