"""`rlvr eval` sampling now: the config it reads its sections from (a run's own, with its newest
adapter, or one made for a model and a data set), with the command's overrides; and the
evaluation itself, the libraries' output kept in a log file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlvr.affinity import allowed_cores
from rlvr.checkpoint.export import export_run, open_run
from rlvr.config import RunConfig, set_dotted, validate_config
from rlvr.eval.runner import held_out_sampling
from rlvr.eval.sample import evaluate_model
from rlvr.models.folder import check_model_folder
from rlvr.models.multimodal import max_positions
from rlvr.tracking.progress import RunProgress
from rlvr.tracking.terminal import quiet_output

# What `rlvr eval MODEL` samples with when no run says otherwise: a real evaluation's length.
EVAL_MAX_TOKENS = 1024


def eval_config(
    model: str | None,
    dataset: str | None,
    adapter: Path | None,
    run: Path | None,
    overrides: dict[str, object],
    say: Callable[[str], object],
) -> tuple[RunConfig, Path | None]:
    """The config an evaluation reads its sections from, `overrides` (dotted keys; None: not given)
    applied, and the adapter to serve. `say` tells which model and adapter a run's own are."""
    cfg, adapter = _run_config(model, dataset, adapter, run, say)
    raw = cfg.model_dump()
    for key, value in overrides.items():
        if value is not None:
            set_dotted(raw, key, value)
    cfg = validate_config(raw, source="rlvr eval")
    if cfg.data.test is None:
        raise ValueError(f"{run}: the run has no data.test; give --dataset")
    return cfg, adapter


def _run_config(
    model: str | None, dataset: str | None, adapter: Path | None, run: Path | None, say: Callable[[str], object]
) -> tuple[RunConfig, Path | None]:
    """The run's own config (with its newest adapter), or one made for MODEL and the dataset; and the
    adapter to serve."""
    if run is None:
        if model is None or dataset is None:
            raise ValueError("give MODEL (or --run RUN_DIR) and --dataset (or --from-rollouts FILE)")
        check_model_folder(model, key="MODEL")
        context = max_positions(model)
        # no run to say how long a prompt may be: as long as the model reads (the engine is sized to the prompts)
        data = {"train": dataset, "test": dataset} | ({"max_prompt_tokens": context} if context else {})
        raw = {
            "model": {"path": model},
            "data": data,
            "rollout": {"sampling": {"max_tokens": EVAL_MAX_TOKENS}},
            # alone on the machine, the engine takes every core: the default half leaves the rest to
            # trainer ranks, which an evaluation has not (a run's own keeps its threads, and so its samples)
            "engine": {"num_threads": len(allowed_cores())},
        }
        return validate_config(raw, source="rlvr eval"), adapter
    if model is not None or adapter is not None:
        raise ValueError("give either --run RUN_DIR or MODEL [--adapter DIR], not both")
    cfg, checkpoint, adapter = open_run(run)
    if adapter is None:  # full fine-tuning has no adapter: evaluate its trained weights, exported
        cfg = cfg.model_copy(
            update={"model": cfg.model.model_copy(update={"path": str(export_run(run, run / "exported", checkpoint))})}
        )
    say(f"run {run}: model {cfg.model.path}, adapter {adapter or '(none: full fine-tuning)'}")
    return cfg, adapter


def evaluate_now(
    cfg: RunConfig,
    adapter: Path | None,
    *,
    samples: Path,
    log: Path,
    verbose: bool,
    progress: bool,
    score_as_configured: bool,
    answers_fill_model: bool,
) -> dict:
    """Sample and score `cfg.data.test` as `cfg` says, writing the samples to `samples` and the
    libraries' output to `log` (unless `verbose`). `score_as_configured`: with cfg.reward's verifier,
    else the set's own."""
    with quiet_output(log, verbose) as terminal, RunProgress(terminal, enabled=progress) as bars:
        return evaluate_model(
            cfg.model,
            cfg.engine,
            cfg.data,
            cfg.data.test,
            reward=cfg.reward if score_as_configured else None,
            adapter=adapter,
            n=cfg.eval.n,
            ks=cfg.eval.k,
            sampling=held_out_sampling(cfg.eval, cfg.rollout.sampling, cfg.seed),
            limit=cfg.eval.max_problems,
            seed=cfg.seed,
            samples_path=samples,
            progress=bars,
            answers_fill_model=answers_fill_model,
        )
