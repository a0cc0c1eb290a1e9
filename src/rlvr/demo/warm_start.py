"""The demo's warm start, run until the model can do what RL needs (`rlvr.config.ReadinessCheck`).

Each attempt builds the tiny model from its own seed and fine-tunes it on worked answers
(rlvr.training.sft), checking every `check.every` steps on held-out train rows. The check is the
run's own evaluation in miniature: the model as RL will start from it (quantized to the demo's
base format, served by the transformers engine from the dequantized view), the run's environment,
verifier and held-out sampling (`rlvr.eval.runner.scored_samples`), then `rlvr.demo.skills`.

On a tools demo an attempt first trains on the answers that call the tool alone, until the model
copies operands into its calls and results into its box, then on the configured mix of calling and
guessing answers. Copying forms through a sharp transition, and the guessed answers, which tie the
box to the operands, hold it back: on the tools demo (Intel Xeon) the 50/50 mix had
not formed it after 2,800 steps (operand copy 0.90, result copy 0.02), the calling answers alone
formed it in 600 (0.94, 0.62 and rising). An attempt ends when the check passes, when the base
accuracy has passed the window's top in a warm start without a copy phase (more steps only raise
it), or when its step budget is spent. A failed attempt is followed by one from a
new seed; if none passes, the run goes on from the attempt closest to ready, and says so.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.config import RunConfig
from rlvr.demo.skills import Skills, measure, shortfalls
from rlvr.engines.hf_engine import HFEngine
from rlvr.envs import EnvContext
from rlvr.eval.runner import held_out_sampling, scored_samples
from rlvr.models.folder import read_model_folder
from rlvr.models.multimodal import max_positions
from rlvr.orchestration.builders import build_scoring_pool, sized_engine
from rlvr.quant import quantize_checkpoint, write_dequantized_checkpoint
from rlvr.rollout.prompts import PromptSet, Renderer, encode_prompt
from rlvr.rollout.trajectories import EnvironmentEngine, TrajectoryRunner
from rlvr.training.sft import warm_start

ATTEMPT_SEED_STRIDE = 1000  # attempt a's seed is cfg.seed + a * stride: no two demo seeds' attempts meet


@dataclass
class Attempt:
    seed: int
    steps: int = 0
    loss: float | None = None
    skills: Skills | None = None
    missing: list[str] = field(default_factory=lambda: ["not checked"])
    checks: list[dict] = field(default_factory=list)

    def closeness(self, window: tuple[float, float]) -> tuple[int, float]:
        """Sort key, smallest first: fewest shortfalls, then the base accuracy's distance from the window."""
        if self.skills is None:
            return len(self.missing), 1.0
        return len(self.missing), max(window[0] - self.skills.accuracy, self.skills.accuracy - window[1], 0.0)


def warm_start_until_ready(
    cfg: RunConfig, build_model, pairs, copy_pairs, tokenizer, check_problems, staging: Path, console
) -> dict:
    """Warm-start `staging` (built from cfg.seed; `build_model(folder, seed)` rebuilds it for a new
    attempt) on `pairs` (rlvr.training.sft), checked on `check_problems`; returns the record summary.json keeps: every attempt's checks,
    and which one the run starts from. With `copy_pairs` (the tool-calling answers alone), each
    attempt first trains on those until the copy checks pass, then on the mix (WarmStartSpec.copy_first)."""

    spec = cfg.demo.warm_start
    check = spec.check
    checker = _Checker(cfg, check_problems, tokenizer, staging) if check is not None else None
    phases = [("copy", copy_pairs), ("mix", pairs)] if copy_pairs and checker is not None else [("mix", pairs)]
    attempts: list[Attempt] = []
    try:
        for index in range(check.attempts if check is not None else 1):
            attempt = Attempt(seed=cfg.seed + index * ATTEMPT_SEED_STRIDE)
            attempts.append(attempt)
            if index:  # the first attempt trains the model as given
                shutil.rmtree(staging, ignore_errors=True)
                build_model(staging, attempt.seed)
            with _WarmStartProgress(console, spec.steps, f"warm start, seed {attempt.seed}") as advance:
                for phase, phase_pairs in phases:
                    done_before = attempt.steps

                    def judge(model, step: int, attempt=attempt, phase=phase, done_before=done_before) -> bool:
                        attempt.steps, attempt.skills = done_before + step, checker.measure(model)
                        attempt.missing = shortfalls(attempt.skills, check)
                        attempt.checks.append({"step": attempt.steps, "phase": phase, **attempt.skills.as_dict()})
                        missing = attempt.missing if phase == "mix" else shortfalls(attempt.skills, check, window=False)
                        verdict = (
                            ("ready" if phase == "mix" else "copies: ready") if not missing else "; ".join(missing)
                        )
                        label = f" ({phase})" if len(phases) > 1 else ""
                        console.print(
                            f"warm start check, step {attempt.steps}{label}: "
                            f"{attempt.skills.describe(check.samples)} ({verdict})",
                            highlight=False,
                        )
                        # trained from scratch on the mix, accuracy only rises: past the window it will not come back.
                        # After the copy phase it falls instead, from always calling to the mix's call rate
                        overshot = len(phases) == 1 and attempt.skills.accuracy > check.base_window[1]
                        return not missing or overshot

                    losses = warm_start(
                        staging,
                        phase_pairs,
                        steps=spec.steps - attempt.steps,
                        batch_size=spec.batch_size,
                        lr=spec.lr,
                        seed=attempt.seed,
                        pad_id=tokenizer.pad_token_id,
                        progress=advance,
                        check=judge if checker is not None else None,
                        check_every=check.every if check else 0,
                    )
                    attempt.loss = losses[-1] if losses else attempt.loss
                    if checker is None:
                        attempt.steps, attempt.missing = len(losses), []
                    if phase == "copy" and shortfalls(attempt.skills, check, window=False):
                        break  # the budget is spent without copying: the mix would not teach it either
            if not attempt.missing:
                break
            shutil.copytree(staging, _kept(staging, index), dirs_exist_ok=True)
            console.print(
                f"warm start, seed {attempt.seed}: not ready after {attempt.steps} steps "
                f"({'; '.join(attempt.missing)})",
                highlight=False,
            )
    finally:
        if checker is not None:
            checker.close()
    chosen = len(attempts) - 1
    if attempts[chosen].missing:  # none ready: the closest
        chosen = min(range(len(attempts)), key=lambda i: attempts[i].closeness(check.base_window))
    if chosen != len(attempts) - 1:
        shutil.rmtree(staging)
        _kept(staging, chosen).replace(staging)
    for index in range(len(attempts)):
        shutil.rmtree(_kept(staging, index), ignore_errors=True)
    start = attempts[chosen]
    if start.skills is not None:
        if start.missing:
            console.print(
                f"[yellow]warning:[/yellow] no warm start was ready in {len(attempts)} attempts; RL starts from "
                f"the closest (seed {start.seed}: {'; '.join(start.missing)})",
                highlight=False,
            )
        console.print(
            f"warm start: {start.skills.describe(check.samples)} after {start.steps:,} steps "
            f"(seed {start.seed}, attempt {chosen + 1} of {len(attempts)})",
            highlight=False,
        )
    return {
        "ready": not start.missing if check is not None else None,  # None: trained `steps` steps, unchecked
        "seed": start.seed,
        "steps": start.steps,
        "final_loss": None if start.loss is None else round(start.loss, 4),
        "skills": None if start.skills is None else start.skills.as_dict(),
        "base_window": None if check is None else list(check.base_window),
        "attempts": [
            {"seed": a.seed, "steps": a.steps, "ready": not a.missing, "missing": a.missing, "checks": a.checks}
            for a in attempts
        ],
    }


class _Checker:
    """Scores the model in training on the check rows as the run's evaluation would score the base."""

    def __init__(self, cfg: RunConfig, problems, tokenizer, staging: Path):

        self.problems, self.staging = problems, staging
        self.renderer = Renderer(tokenizer, cfg.data)
        self.prompts = [encode_prompt(p, tokenizer, cfg.data) for p in problems]
        self.cfg = sized_engine(
            cfg, [PromptSet(problems, self.prompts, "the warm start's check rows")], max_positions(cfg.model.path)
        )
        # the base as RL will start from it: quantized, and the float view the transformers engine serves of that
        self.quantized = staging.with_name(staging.name + ".check")
        self.view = staging.with_name(staging.name + ".check.dequantized")
        self._closing = ExitStack()  # what the run's own builders open, closed by close()
        self.pool = self._closing.enter_context(build_scoring_pool(cfg))
        self.context = EnvContext(cfg.env, cfg.sandbox)
        self._closing.callback(self.context.close)

    def measure(self, model) -> Skills:

        cfg, check = self.cfg, self.cfg.demo.warm_start.check
        model.save_pretrained(self.staging)
        served = self.staging
        if cfg.demo.base_format != "hf":
            self._remove_copies()
            quantize_checkpoint(self.staging, self.quantized, format=cfg.demo.base_format)
            served = write_dequantized_checkpoint(self.quantized, self.view)
        engine = HFEngine(
            read_model_folder(served),
            cfg.engine.model_copy(update={"hf_batch_size": len(self.problems) * check.samples}),
            dtype=cfg.model.dtype,
            seed=cfg.seed,
        )
        try:
            runner = TrajectoryRunner(engine, self.renderer, cfg.env, self.context, cfg.engine.max_model_len)
            rows = scored_samples(
                EnvironmentEngine(runner, self.problems),
                self.pool,
                self.problems,
                self.prompts,
                n=check.samples,
                sampling=held_out_sampling(cfg.eval, cfg.rollout.sampling, cfg.seed),
            )
        finally:
            engine.close()
        return measure(rows, {p.id: p.question for p in self.problems})

    def close(self) -> None:
        self._closing.close()
        self._remove_copies()

    def _remove_copies(self) -> None:
        for folder in (self.quantized, self.view):
            shutil.rmtree(folder, ignore_errors=True)


def _kept(staging: Path, index: int) -> Path:
    return staging.with_name(f"{staging.name}.attempt{index}")


class _WarmStartProgress:
    """A rich progress bar over the warm start's steps (a log file gets a line every 10%)."""

    def __init__(self, console, total: int, description: str):
        self.console, self.total, self.description, self.done = console, total, description, 0

    def __enter__(self):
        from rich.progress import Progress

        self.bar = Progress(console=self.console, transient=True).__enter__()
        self.task = self.bar.add_task(self.description, total=self.total)
        return self.advance

    def advance(self, loss: float) -> None:
        self.done += 1
        self.bar.update(self.task, advance=1, description=f"{self.description}, loss {loss:.3f}")
        if not self.console.is_terminal and self.done % max(1, self.total // 10) == 0:
            self.console.print(f"{self.description}: step {self.done}/{self.total}, loss {loss:.3f}", highlight=False)

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)
