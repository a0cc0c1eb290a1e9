"""`rlvr` command line: train, demo, eval, score (and, as they land, quantize, export, report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from rlvr.config import ConfigError, dump_config, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RL of LLMs against verifiable rewards.")
console = Console()
DEMO_CONFIG = "configs/demo.yaml"


def _load(config: Path, overrides: list[str]):
    try:
        return load_config(config, overrides)
    except ConfigError as err:
        console.print(f"[red]config error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML config"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. trainer.lr=1e-5"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and print the resolved config, run nothing"),
):
    """Run RL training as the config says."""
    cfg = _load(config, overrides or [])
    if dry_run:
        console.print(dump_config(cfg), highlight=False, end="")
        return
    _run(cfg)


@app.command()
def demo(
    config: Path = typer.Option(Path(DEMO_CONFIG), "--config", help="the demo's config"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides"),
):
    """`rlvr train configs/demo.yaml`, first building the tiny model and task if missing."""
    from rlvr.demo import ensure_demo_assets

    cfg = _load(config, overrides or [])
    if cfg.demo is None:
        console.print(f"[red]config error:[/red] {config}: a demo config needs a `demo:` section")
        raise typer.Exit(2)
    ensure_demo_assets(cfg, console)
    _run(cfg)


def _run(cfg) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rlvr.orchestration.controller import train as run_training

    columns = [TextColumn("RL steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, disable=not cfg.tracking.progress) as bar:
        task = bar.add_task("steps", total=cfg.steps, info="starting engine and trainer")

        def on_step(step: int, metrics: dict) -> None:
            bar.update(task, completed=step, info=f"reward {metrics['reward/mean']:.3f}  {metrics['time/step']:.1f}s/step")

        summary = run_training(cfg, progress=on_step)
    console.print_json(json.dumps(summary))
    console.print(f"wrote {Path(cfg.run_dir) / 'summary.json'} and metrics.jsonl")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
