"""`rlvr` command line: train, demo, eval, score, quantize, export, report."""

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
    dry_run: bool = typer.Option(
        False, "--dry-run", help="validate; print the resolved config, the placement plan and a memory estimate per device; run nothing"
    ),
    resume: Optional[str] = typer.Option(
        None, "--resume", help="'latest' (the config's run_dir) or a RUN_DIR: continue from its last good checkpoint"
    ),
):
    """Run RL training as the config says."""
    extra = [] if resume in (None, "latest") else [f"run_dir={resume}"]
    cfg = _load(config, [*(overrides or []), *extra])
    if dry_run:
        from rlvr.orchestration.plan import PlanError, make_plan, print_plan

        console.print(dump_config(cfg), highlight=False, end="")
        try:
            plan = make_plan(cfg)
        except PlanError as err:
            console.print(f"[red]plan error:[/red] {config}: {err}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        console.print()
        print_plan(plan, cfg, console)
        return
    _run(cfg, resume=resume is not None)


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


@app.command()
def score(
    input_path: Path = typer.Argument(..., metavar="IN.jsonl", help='rows with "response" and "answer"'),
    output: Path = typer.Option(..., "-o", "--output", help="OUT.jsonl: each row plus reward and status"),
    verifier: str = typer.Option("math", "--verifier", help="math | aime | gsm8k | exact | regex | module:function"),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="report and skip bad rows instead of stopping"),
    workers: int = typer.Option(2, "--workers"),
    timeout_s: float = typer.Option(2.0, "--timeout", help="seconds per item"),
):
    """Score a JSONL file of responses with a verifier, in the sandboxed pool."""
    from rlvr.rewards.score_file import score_file

    try:
        score_file(input_path, output, verifier=verifier, skip_bad=skip_bad, workers=workers, timeout_s=timeout_s)
    except (ValueError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@app.command("eval")
def eval_command(
    model: Optional[str] = typer.Argument(None, help="HF model folder to sample from"),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="built-in set name or a .jsonl/.json/.parquet file"),
    adapter: Optional[Path] = typer.Option(None, "--adapter", help="a PEFT LoRA adapter folder to serve on top"),
    run: Optional[Path] = typer.Option(
        None, "--run", help="a run folder: its base model and its newest intact checkpoint's adapter"
    ),
    n: int = typer.Option(8, "--n", help="samples per problem"),
    k: str = typer.Option("1,8", "--k", help="comma-separated k values"),
    temperature: float = typer.Option(1.0, "--temperature"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="default 1024, or the run's rollout length"),
    template: Optional[str] = typer.Option(None, "--template", help="prompt template name (default boxed, or the run's)"),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="default: the set's own (aime, gsm8k, math)"),
    limit: Optional[int] = typer.Option(None, "--limit", help="only the first N problems"),
    backend: str = typer.Option("vllm", "--backend", help="vllm | hf"),
    kv_cache_gb: float = typer.Option(2.0, "--kv-cache-gb", help="vLLM KV-cache size (CPU memory on CPU)"),
    seed: int = typer.Option(0, "--seed"),
    from_rollouts: Optional[Path] = typer.Option(None, "--from-rollouts", help="recompute metrics from saved samples"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the metrics JSON here"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars (off anyway when not a terminal)"),
):
    """avg@k, unbiased pass@k and maj@k with standard errors, sampled now or from saved rows."""
    ks = [int(x) for x in k.split(",") if x.strip()]
    try:
        if from_rollouts is not None:
            from rlvr.eval.rollouts_file import metrics_from_rollouts

            result = metrics_from_rollouts(from_rollouts, ks)
        else:
            if run is not None:  # the run's model, adapter, test set, template and length unless given
                from rlvr.checkpoint.export import export_run, open_run
                from rlvr.orchestration.controller import engine_model_path

                if model is not None or adapter is not None:
                    raise ValueError("give either --run RUN_DIR or MODEL [--adapter DIR], not both")
                run_cfg, checkpoint, adapter = open_run(run)
                # full fine-tuning has no adapter: evaluate its trained weights, exported
                model = engine_model_path(run_cfg.model.path) if adapter else str(export_run(run, run / "exported", checkpoint))
                dataset = dataset or run_cfg.data.test
                template = template or run_cfg.data.template
                max_tokens = max_tokens or run_cfg.rollout.sampling.max_tokens
                verifier = verifier or run_cfg.reward.verifier
                console.print(f"run {run}: model {model}, adapter {adapter or '(none: full fine-tuning)'}")
            if model is None or dataset is None:
                raise ValueError("give MODEL (or --run RUN_DIR) and --dataset (or --from-rollouts FILE)")
            from rlvr.eval.sample import evaluate_model
            from rlvr.tracking.progress import RunProgress

            samples = (out.with_suffix(".samples.jsonl") if out else Path("eval_samples.jsonl"))
            with RunProgress(console, enabled=not no_progress) as progress:
                result = evaluate_model(
                    model, dataset, adapter=adapter, n=n, ks=ks, temperature=temperature, max_tokens=max_tokens or 1024,
                    template=template or "boxed", verifier=verifier, limit=limit, backend=backend, kv_cache_gb=kv_cache_gb,
                    seed=seed, samples_path=samples, progress=progress,
                )
            console.print(f"samples: {samples}")
    except ValueError as err:
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    headline = {key: value for key, value in result.items() if key != "problems"}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(headline | {"problems": result.get("problems", [])}, indent=2, allow_nan=False))
        console.print(f"wrote {out}")
    console.print_json(json.dumps(headline, allow_nan=False))


@app.command()
def quantize(
    model: Path = typer.Argument(..., help="HF causal LM folder"),
    out: Path = typer.Argument(..., help="output folder"),
    format: str = typer.Option(
        "nvfp4", "--format", help="nvfp4 (compressed-tensors nvfp4-pack-quantized) or nf4 (bitsandbytes 4-bit NF4)"
    ),
    ignore: str = typer.Option(
        "lm_head", "--ignore", help="comma-separated on-disk module names (or re:patterns) kept in float; routers always are"
    ),
):
    """Write MODEL as a 4-bit checkpoint that vLLM and rlvr's trainer load."""
    from rlvr.quant.checkpoint import quantize_checkpoint

    try:
        path = quantize_checkpoint(model, out, format=format, ignore=[x for x in ignore.split(",") if x])
    except (ValueError, OSError) as err:
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(f"wrote {path} ({format})")


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="a run folder"),
    out: Path = typer.Argument(..., help="output folder: a plain HF model"),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="step_N or a folder; default the newest intact"),
):
    """Merge the run's adapter into its (dequantized) base and write an HF model folder."""
    from rlvr.checkpoint.export import export_run

    try:
        path = export_run(run_dir, out, checkpoint)
    except (ValueError, OSError) as err:
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(f"wrote {path}")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a run folder with metrics.jsonl")):
    """Write RUN_DIR/report.html (plots, config, eval tables, sample rollouts)."""
    from rlvr.tracking.report import write_report

    try:
        path = write_report(run_dir)
    except (ValueError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(f"report: {path}")


def _run(cfg, resume: bool = False) -> None:
    from rlvr.orchestration import RunStopped
    from rlvr.orchestration.controller import train as run_training
    from rlvr.tracking.progress import RunProgress

    try:
        with RunProgress(console, enabled=cfg.tracking.progress, steps=cfg.steps) as progress:
            summary = run_training(cfg, progress=progress, resume=resume, log=progress.console.print)
    except (ValueError, RunStopped) as err:  # bad data, a missing checkpoint, a run that cannot go on: one line, no traceback
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    from rlvr.tracking.report import write_report

    console.print_json(json.dumps(summary))
    console.print(f"wrote {Path(cfg.run_dir) / 'summary.json'} and metrics.jsonl")
    console.print(f"report: {write_report(cfg.run_dir)}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
