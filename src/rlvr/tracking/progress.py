"""Rich progress bars for a run: RL steps, and each generation, scoring and eval phase.

    with RunProgress(console, enabled=cfg.tracking.progress, steps=cfg.steps) as progress:
        rollouts = engine.generate(prompts, n, sampling, progress=phase(progress, "generate", len(prompts) * n))
        scores = pool.score(texts, answers, progress=phase(progress, "score", len(rollouts)))
        progress(step, metrics)          # the step bar: the controller's progress(step, metrics)

Engines and the scoring pool know nothing of rich: they take an optional `progress`
callable and call it with the number of items just finished. `phase` returns None when bars
are off, so they skip even that. Each phase keeps one line that is reset when the phase
runs again, so the display is a few stable lines rather than a scroll of finished bars.

Bars are off when `tracking.progress` is false and whenever the console is not a terminal
(CI logs, a pipe, a file): there rich would print a final frame of every bar into the log, so
the step bar becomes one plain line every tenth of the run instead.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

Advance = Callable[[int], None]
"""What engines and the scoring pool call with the number of items they just finished."""

STEPS = "RL steps"


class RunProgress:
    """The run's bars on `console`: one for RL steps (when `steps` is given) and one per phase."""

    def __init__(self, console: Console, *, enabled: bool = True, steps: int | None = None):
        self.enabled = enabled and console.is_terminal
        self._steps = steps
        self._line_every = max(1, (steps or 0) // 10) if enabled and not self.enabled and steps else 0
        self._bars = Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            disable=not self.enabled,
        )
        self._tasks: dict[str, TaskID] = {}
        if steps is not None:
            self._tasks[STEPS] = self._bars.add_task(STEPS, total=steps, info="starting engine and trainer")

    @property
    def console(self) -> Console:
        """Print through this while the bars are live, so lines land above them."""
        return self._bars.console

    def __call__(self, step: int, metrics: dict) -> None:
        """The step bar: `step` steps done, the step's reward, response length and time beside it;
        not in a terminal, a line every tenth of the run (and at its last step)."""
        info = ""
        if "reward/mean" in metrics:
            info = (
                f"reward {metrics['reward/mean']:.3f}  length {metrics['response/length_mean']:.1f}  "
                f"{metrics['time/step']:.2f} s/step"
            )
        self._bars.update(self._tasks[STEPS], completed=step, info=info)
        if self._line_every and (step % self._line_every == 0 or step == self._steps):
            self.console.print(f"step {step}/{self._steps}  {info}", highlight=False)

    def start_phase(self, description: str, total: int) -> Advance:
        """Reset (or add) the line `description` to 0 of `total`; returns its advance callable."""
        if description in self._tasks:
            self._bars.reset(self._tasks[description], total=total, info="")
        else:
            self._tasks[description] = self._bars.add_task(description, total=total, info="")
        task = self._tasks[description]
        return lambda done: self._bars.advance(task, done)

    def __enter__(self) -> RunProgress:
        self._bars.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bars.stop()


def phase(progress, description: str, total: int) -> Advance | None:
    """Start a phase's bar and return its advance callable; None without bars: bars off, or
    `progress` None or a plain step callback rather than a RunProgress."""
    if not isinstance(progress, RunProgress) or not progress.enabled:
        return None
    return progress.start_phase(description, total)
