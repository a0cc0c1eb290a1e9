"""A training run driven from the terminal (`rlvr train`, `rlvr demo`): only rlvr's own lines there,
the rest in RUN_DIR/logs/run.log; then its report, and the lines it ends with: what ran, each
held-out change with its paired standard error, and what it wrote."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from rlvr.config import RunConfig
from rlvr.eval.report import write_report
from rlvr.orchestration.loop import train
from rlvr.tracking.progress import RunProgress
from rlvr.tracking.terminal import run_output


def run_in_terminal(
    cfg: RunConfig,
    *,
    resume: bool,
    verbose: bool,
    prepare: Callable[[Console], dict | None] | None = None,
) -> list[str]:
    """Run `cfg` (`resume`: from its last good checkpoint); `prepare`, given the terminal, readies
    what the run needs first and returns notes for its summary. `verbose`: every library's output
    on the terminal too. Returns the lines to end with."""
    with run_output(cfg.run_dir, verbose) as terminal:  # an error leaves it (output restored), then the caller says it
        notes = prepare(terminal) if prepare is not None else None
        with RunProgress(terminal, enabled=cfg.tracking.progress, steps=cfg.steps) as progress:
            summary = train(cfg, progress=progress, resume=resume, log=progress.console.print, notes=notes)
        report = write_report(cfg.run_dir)
    return summary_lines(summary, cfg, report, logs=not verbose)


def summary_lines(summary: dict, cfg: RunConfig, report: Path, logs: bool) -> list[str]:
    """From the run's summary.json contents; `logs`: the libraries' output went to RUN_DIR/logs."""
    last, first = summary.get("stopped_after_step", summary["steps"]), summary.get("resumed_after_step", 0)
    steps = f"{last - first} steps" + (f" after resuming at step {first}" if first else "")
    lora = f"LoRA r{summary['lora_rank']}" if summary.get("lora_rank") else "full fine-tuning"
    lines = [
        f"done: {steps} in {summary['wall_seconds']:.0f} s (engine {summary.get('engine')}, "
        f"{summary.get('trainer_ranks')} trainer ranks, {summary.get('base_format')} base, {lora})"
    ]
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    k = max(cfg.eval.k)
    for key in [f"{m}@{k}" for m in ("avg", "pass", "maj") if f"{m}@{k}" in after and f"{m}@{k}" in before]:
        change = after[key] - before[key]
        paired = after.get(f"paired/stderr/{key}")  # the same problems before and after: the error of the change
        spread = "" if paired is None else f" ± {paired * 100:.1f}, paired standard error"
        lines.append(f"held-out {key}: {before[key]:.3f} -> {after[key]:.3f} ({change * 100:+.1f} points{spread})")
    unseen = (f"unseen_before/avg@{k}", f"unseen_after/avg@{k}")
    if all(key in after for key in unseen):  # some test prompts were also training prompts
        lines.append(
            f"  on the test problems never drawn for training: {after[unseen[0]]:.3f} -> {after[unseen[1]]:.3f} "
            f"({(after[unseen[1]] - after[unseen[0]]) * 100:+.1f} points)"
        )
    run_dir = Path(cfg.run_dir)
    lines.append(
        f"wrote {run_dir / 'summary.json'}, metrics.jsonl and {report.name}"
        + (f"; logs in {run_dir / 'logs'}" if logs else "")
    )
    return lines
