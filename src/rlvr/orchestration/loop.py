"""The RL loop: one process drives the stages, each a component built by rlvr.orchestration.builders.

    prompts -> engine.generate -> pool.score -> advantages -> trainer step -> weight sync
    (every N steps: evaluation, checkpoint; every step: metrics)

The rollouts come from the run's rollout source (rlvr.rollout.source), one per `rollout.mode`;
the loop asks it the same questions whichever it is. With `one_step_off` the ranks train step t
while the engine, still serving the policy of step t-1, generates the rollouts of step t+1; the
trainer corrects for the lag with truncated importance sampling (`algorithm.tis_cap`, or
`algorithm.masked_is`). With `async` the engine's samples outlive the step that started them
(rlvr.rollout.async_groups), and each push reaches them mid-sequence. Only this thread steps
the engine, at fixed points (inside the source's collection, in the sync probe's drain), so a
seed fixes which tokens each version samples: an async run is as reproducible, and resumes as
exactly, as a synchronous one.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from rlvr.affinity import process_cores
from rlvr.config import RunConfig
from rlvr.orchestration import RunStopped
from rlvr.orchestration.builders import Run, build_run
from rlvr.orchestration.run_state import RunState
from rlvr.planning.architecture import planned_dtype
from rlvr.rollout.collect import StepRollouts


def train(cfg: RunConfig, progress=None, resume: bool = False, log=print, notes: dict | None = None) -> dict:
    """Run cfg.steps RL steps; write metrics.jsonl and summary.json under cfg.run_dir.

    With `resume`, continue from the newest intact checkpoint in cfg.run_dir. `notes` go into
    summary.json as they are (the demo's warm start record)."""
    started = time.time()
    summary: dict = {"model": cfg.model.path, "steps": cfg.steps, "seed": cfg.seed} | (notes or {})
    with ExitStack() as stack:
        run = build_run(cfg, stack, progress, log, resume)
        state = _begin(run, summary)
        stop_signal = stack.enter_context(_stop_requests())
        skips = _SkipGuard(run)
        for step in range(state.step + 1, cfg.steps + 1):
            step_start = time.perf_counter()
            current = run.source.next(step)
            metrics = _train(run, current, step, stop_signal)
            stopping = bool(stop_signal) and step < cfg.steps
            saving = run.checkpoints.due(step, stopping)
            # Where a step trains on rollouts of the policy pushed last, its sampler gap checks that
            # push. What uses a push before such a check (an evaluation; the rollouts generated
            # ahead) needs the sync probe.
            trained_gap = metrics.get("sync/sampler_trainer_gap") if run.source.push_checked_by_next_step else None
            used_unchecked = run.source.push_used_unchecked(saving) or run.evaluation.uses_push_of(step)
            metrics |= (
                run.sync.push(step, trained_gap, used_unchecked)
                | current.metrics
                | {"engine/restarts": run.engine.restarts}
            )
            skips.check(step, metrics)
            if run.evaluation.due(step):
                metrics |= _prefixed("eval/", run.evaluation.run(f"step{step}"))
            if saving:
                rollouts = run.source.state()
                run.checkpoints.save(
                    RunState(step, rollouts.data_position, state.eval_before), run.trainer, run.sync, rollouts
                )
            _log_step(run, step, metrics, current, step_start)
            if stopping:
                log(f"{stop_signal[0]}: stopped after step {step}, checkpoint written; continue with --resume")
                summary["stopped_after_step"] = step
                break
        else:
            summary["eval_after"] = run.evaluation.run("after")
            run.logger.log(cfg.steps, _prefixed("eval_after/", summary["eval_after"]) | run.timer.pop_metrics())
        if run.cores is not None:
            summary["cores"] = _cores_used(run, run.cores.split)
    summary["wall_seconds"] = round(time.time() - started, 1)
    (Path(cfg.run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _begin(run: Run, summary: dict) -> RunState:
    """A new run pushes its initial policy to the engine and evaluates it. A resumed one restores
    the trainer, the data position and what was in flight (one step off-policy, regenerated from
    the adapter that generated it) before pushing the trainer's policy."""
    if run.resume_from is None:
        state = RunState()
        run.sync.push(step=0)
    else:
        state = run.checkpoints.restore(run.resume_from, run.trainer)
        run.sampler.position = state.data_position
        run.logger.truncate_after(state.step, redone="eval_after/")  # a run killed in its final eval does it again
        run.log(f"resuming from {run.resume_from} (step {state.step})")
        summary["resumed_after_step"] = state.step
        run.source.restore(
            run.resume_from,
            run.checkpoints.saved_rollouts(run.resume_from),
            state.step,
            run.cfg.steps,
            serve=run.sync.serve,
        )
        run.sync.push(step=state.step)
    summary.update(_describe(run))
    if run.resume_from is None:
        state.eval_before = run.evaluation.run("before")
        run.logger.log(0, _prefixed("eval/", state.eval_before) | run.timer.pop_metrics())
    summary["eval_before"] = state.eval_before
    return state


def _train(run: Run, current: StepRollouts, step: int, stop_signal: list) -> dict:
    """One trainer step on `current`; where the source generates ahead, the engine generates the
    next step's rollouts meanwhile."""
    cfg = run.cfg
    # Colocated and synchronous, the engine is idle while the ranks train on the same devices,
    # so it sleeps (a no-op where the backend cannot); generating ahead, it must stay awake.
    sleep_while_training = cfg.placement.colocate and not run.source.generates_ahead
    if sleep_while_training:
        run.engine.sleep()
    run.trainer.start_train_step(current.batch, temperature=cfg.rollout.sampling.temperature)
    training_start = time.perf_counter()
    # A stop request skips the work ahead only where the resumed run redoes it exactly; otherwise
    # whether the next step's rollouts saw this step's push would depend on when the signal landed.
    skip_ahead = bool(stop_signal) and not run.source.checkpoints_generated_ahead
    if run.source.generates_ahead and step < cfg.steps and not skip_ahead:
        run.source.generate_ahead(step + 1)  # the engine works while the ranks train
    generated_ahead = time.perf_counter() - training_start
    metrics = run.trainer.finish_train_step()
    if sleep_while_training:
        run.engine.wake()
    # time/overlap: seconds in which the engine (generating ahead) and the ranks (training) both
    # worked; generate + train - overlap is the wall time the two took together.
    overlap = max(0.0, generated_ahead + metrics["time/train"] - (time.perf_counter() - training_start))
    return metrics | {"time/overlap": overlap}


def _log_step(run: Run, step: int, metrics: dict, current: StepRollouts, step_start: float) -> None:
    step_seconds = time.perf_counter() - step_start
    generated = sum(len(c) for c in current.batch.completion_ids)
    metrics |= run.timer.pop_metrics() | {
        "time/step": step_seconds,
        "throughput/tokens_per_s": generated / step_seconds,
    }
    run.logger.log(step, metrics)
    if run.progress is not None:
        run.progress(step, metrics)


def _describe(run: Run) -> dict:
    """What ran, for summary.json; says so when packed attention was asked for but not possible."""
    cfg, trainer, started = run.cfg, run.trainer, run.trainer.wait_started()
    if cfg.trainer.attention == "packed" and not started.packed_attention:
        run.log(
            f"trainer.attention: packed is not available for {cfg.model.path} (its attention does not dispatch "
            "through transformers' AttentionInterface): training with sdpa's block-diagonal mask and a prompt "
            "copy per sample"
        )
    compute = planned_dtype(cfg.model, cfg.placement)
    return {
        "compute_dtype": compute.name,
        "compute_dtype_reason": compute.reason,
        "engine": run.engine.name,
        "trainer_ranks": trainer.world_size,
        "base_format": started.base_format,
        "trainer_attention": "packed" if started.packed_attention else "sdpa",
        "lora_rank": int(run.sync.serving.config["r"]) if run.sync.serving is not None else None,
    }


def _cores_used(run: Run, split: bool) -> dict:
    """Where the run's threads could run by its end, as the kernel says (every thread of each
    process: torch's OpenMP pool, gloo's, vLLM's), and the torch threads each computed with."""
    import torch

    return {
        "split": split,
        "controller": {"cores": process_cores(), "threads": torch.get_num_threads()},
        "ranks": run.trainer.placement(),
    }


class _SkipGuard:
    """Stops the run when trainer.max_consecutive_skips steps in a row skipped their update."""

    def __init__(self, run: Run):
        self.run, self.in_a_row = run, 0

    def check(self, step: int, metrics: dict) -> None:
        limit = self.run.cfg.trainer.max_consecutive_skips
        self.in_a_row = self.in_a_row + 1 if metrics["skipped"] else 0
        if self.in_a_row:
            self.run.log(
                f"step {step}: grad_norm={metrics['grad_norm']}, optimizer step skipped ({self.in_a_row} in a row)"
            )
        if self.in_a_row >= limit:
            self.run.logger.log(step, metrics | self.run.timer.pop_metrics())
            raise RunStopped(
                f"trainer.max_consecutive_skips={limit}: steps {step - self.in_a_row + 1}-{step} had a non-finite "
                f"loss or gradient; stopped, last checkpoint {self.run.checkpoints.latest()}"
            )


def _prefixed(prefix: str, values: dict) -> dict:
    return {f"{prefix}{k}": v for k, v in values.items()}


@contextmanager
def _stop_requests() -> Iterator[list[str]]:
    """SIGTERM and SIGINT ask the loop to finish the current step, checkpoint and return; the
    list yielded holds the signal's name once one came. A second Ctrl-C interrupts at once."""
    requested: list[str] = []

    def on_signal(signum, _frame):
        if requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        requested.append(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield requested
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
