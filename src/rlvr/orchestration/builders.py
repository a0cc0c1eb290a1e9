"""Every component of a run, built from its typed config section, wired into one `Run`.

    run = build_run(cfg, stack, progress, log)   # stack (an ExitStack) closes what needs closing
    run.source.next(step); run.trainer.start_train_step(...); run.sync.push(step) ...

The loop (rlvr.orchestration.loop) only calls these components; which engine, which placement,
which verifier is decided here, once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from rlvr.affinity import allowed_cores, pinned
from rlvr.config import RunConfig, dump_config
from rlvr.engines import make_engine
from rlvr.envs import EnvContext
from rlvr.models.folder import ModelFolder, check_model_folder
from rlvr.models.tokenizer import load_tokenizer
from rlvr.orchestration.engine_supervisor import EngineSupervisor
from rlvr.orchestration.evaluation import Evaluation
from rlvr.orchestration.ray_placement import RayCluster
from rlvr.orchestration.run_state import RunCheckpoints
from rlvr.planning.architecture import planned_dtype
from rlvr.planning.cpu_split import CpuSplit, cpu_split
from rlvr.planning.lora import with_engine_lora_targets
from rlvr.planning.sections import PlanSections
from rlvr.rewards import ScoringPool
from rlvr.rollout.async_groups import AsyncGroups
from rlvr.rollout.collect import RolloutCollector, training_sampling
from rlvr.rollout.prompts import PromptSet, Renderer, engine_context, load_prompt_set
from rlvr.rollout.sampler import EpochSampler
from rlvr.rollout.source import RolloutSource, make_source
from rlvr.rollout.trajectories import Episodes, Start, TrajectoryRunner
from rlvr.sync.check import SyncCheck
from rlvr.sync.weights import WeightSync
from rlvr.tracking.metrics_log import MetricsLogger
from rlvr.tracking.progress import RunProgress
from rlvr.tracking.timing import StepTimer
from rlvr.training.trainer import Trainer
from rlvr.training.worker import RankSpec


@dataclass
class Run:
    """The components the loop calls, built once per run."""

    cfg: RunConfig
    trainer: Trainer
    engine: EngineSupervisor
    sampler: EpochSampler
    source: RolloutSource  # Synchronous, OneStepAhead or Streaming, as rollout.mode says
    sync: WeightSync
    evaluation: Evaluation
    checkpoints: RunCheckpoints
    resume_from: Path | None  # the checkpoint this run continues from
    logger: MetricsLogger
    timer: StepTimer
    progress: RunProgress | None
    log: Callable[[str], None]
    cores: CpuSplit | None = None  # on a CPU machine, the cores of the controller and of each rank


def build_run(cfg: RunConfig, stack: ExitStack, progress=None, log=print, resume: bool = False) -> Run:
    """Write the run folder's config.yaml, then start the trainer ranks, the engine and the scoring
    pool (closed by `stack`) and wire the stages between them. With `resume`, the checkpoint to
    continue from is found first: without one, nothing starts."""

    folder = check_model_folder(cfg.model.path)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # as given: a resumed run sizes its engine again, and picks model.dtype: auto's dtype on its own machine
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    log(planned_dtype(cfg.model, cfg.placement).line())
    torch.manual_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.model.path)
    train_set = load_prompt_set(cfg.data, cfg.data.train, tokenizer)
    test_set = (
        load_prompt_set(cfg.data, cfg.data.test, tokenizer, limit=cfg.eval.max_problems) if cfg.data.test else None
    )
    cfg = sized_engine(cfg, [train_set, *([test_set] if test_set else [])], folder.max_positions)
    cfg = cfg.model_copy(update={"trainer": with_engine_lora_targets(cfg.model, cfg.trainer, folder, log)})
    shared = test_set.shared_with(train_set) if test_set is not None else 0
    if test_set is not None and shared:
        log(
            f"note: {shared} of the {len(test_set.problems)} test problems also occur in data.train (the same prompt): "
            "held-out figures include them"
        )
    timer = StepTimer()
    checkpoints = RunCheckpoints(cfg, timer, log)
    resume_from = checkpoints.resumable() if resume else None
    # before anything starts: what it starts inherits the controller's cores
    cores = place_on_cores(cfg, folder, stack, log)
    pool = stack.enter_context(build_scoring_pool(cfg, log))  # first: a bad reward.options fails before the slow starts
    trainer = stack.enter_context(build_trainer(cfg, folder, cores))  # its ranks load while the engine starts
    engine = stack.enter_context(build_engine(cfg, folder, log, cores))
    trainer.wait_started()
    logger = stack.enter_context(MetricsLogger(run_dir, cfg.tracking.backends, config=cfg.model_dump(mode="json")))
    sampler = EpochSampler(len(train_set.problems), cfg.seed)
    context = EnvContext(cfg.env, cfg.sandbox)
    stack.callback(context.close)
    mode, max_model_len = cfg.rollout.mode, cfg.engine.max_model_len
    assert mode is not None and max_model_len is not None  # resolved by RolloutConfig and by sized_engine
    # fully asynchronous, every rollout (evaluations too) advances at fixed engine steps: see Episodes
    runner = TrajectoryRunner(
        engine,
        Renderer(tokenizer, cfg.data),
        cfg.env,
        context,
        max_model_len,
        fixed_order=mode == "async",
    )
    stream = build_stream(cfg, runner, train_set, sampler, stack) if mode == "async" else None
    collector = RolloutCollector(
        cfg.rollout,
        cfg.algorithm,
        cfg.reward,
        runner,
        pool,
        train_set,
        sampler,
        seed=cfg.seed,
        timer=timer,
        progress=progress,
        log=log,
        stream=stream,
    )
    source = make_source(mode, collector, engine, stream, timer)
    sync = WeightSync(
        engine,
        trainer,
        train_set.probe(tokenizer),
        SyncCheck(cfg.engine.sync_threshold(planned_dtype(cfg.model, cfg.placement).name)),
        timer,
        lora=cfg.trainer.lora is not None,
        check_every=cfg.engine.sync_check_every,
        route=source,
    )
    return Run(
        cfg=cfg,
        trainer=trainer,
        engine=engine,
        sampler=sampler,
        source=source,
        sync=sync,
        # where test prompts also occur in data.train, the evaluation also reports those never drawn
        evaluation=Evaluation(
            cfg,
            runner,
            pool,
            test_set,
            timer,
            progress,
            log,
            train_set=train_set if shared else None,
            sampler=sampler if shared else None,
        ),
        checkpoints=checkpoints,
        resume_from=resume_from,
        logger=logger,
        timer=timer,
        progress=progress,
        log=log,
        cores=cores,
    )


def build_stream(
    cfg: RunConfig, runner: TrajectoryRunner, train_set: PromptSet, sampler: EpochSampler, stack: ExitStack
) -> AsyncGroups:
    """The fully asynchronous rollout stream: it draws the prompts in the sampler's order, and
    keeps prompts_per_step x max(K, 1) groups in flight. A group is then drawn at most K steps
    before the step that trains it (rollouts generated one step ahead count one), so that only
    the long tail, still running after K steps' generation, goes stale."""

    def draw():
        index = sampler.take(1)[0]
        return index, Start(train_set.problems[index], train_set.prompts[index])

    rollout = cfg.rollout
    episodes = stack.enter_context(Episodes(runner))
    return AsyncGroups(
        episodes,
        draw,
        samples=rollout.samples_per_prompt,
        sampling=replace(training_sampling(rollout.sampling), seed=cfg.seed * 100_003),
        max_staleness=rollout.max_staleness,
        capacity=rollout.prompts_per_step * max(rollout.max_staleness, 1),
        version=None,
    )


def place_on_cores(cfg: RunConfig, folder: ModelFolder | None, stack: ExitStack, log=print) -> CpuSplit | None:
    """On a CPU machine, the run's cores (rlvr.planning.cpu_split): its warning said once, and
    with placement.engine_cpus this process (the controller, with its engine) pinned to its cores
    until `stack` closes. None on GPUs."""

    if cfg.placement.gpus_per_node or torch.cuda.is_available():
        return None
    cores = cpu_split(PlanSections.of(cfg, folder), allowed_cores())
    if cores.warning:
        log(f"warning: {cores.warning}")
    if cores.split:
        stack.enter_context(pinned(cores.controller))
    return cores


def build_trainer(cfg: RunConfig, folder: ModelFolder, cores: CpuSplit | None = None):
    """The trainer ranks on the model `folder` (cfg.model.path's, read once): local processes, or
    Ray actors with `placement.backend: ray`; with a split of the cores, each on its own."""

    split = cores if cores is not None and cores.split else None
    spec = RankSpec(
        folder=folder,
        dtype=cfg.model.dtype,
        trainer=cfg.trainer,
        algorithm=cfg.algorithm,
        seed=cfg.seed,
        total_steps=cfg.steps,
        threads=split.rank_threads if split is not None else 0,
        cores=split.ranks if split is not None else None,
    )
    return Trainer(spec, launch=_ray_cluster(cfg).launch_ranks if cfg.placement.backend == "ray" else None)


def build_engine(cfg: RunConfig, folder: ModelFolder, log=print, cores: CpuSplit | None = None):
    """The engine on the model `folder` (cfg.model.path's, read once), restarted by its supervisor
    when its process dies; with a split of the cores, a thread per core of its own."""

    engine = cfg.engine
    if cores is not None and cores.split:
        engine = engine.model_copy(update={"num_threads": cores.engine_threads})

    def start():
        return make_engine(
            folder,
            engine,
            dtype=cfg.model.dtype,
            seed=cfg.seed,
            lora_rank=cfg.trainer.lora.rank if cfg.trainer.lora else None,
            # colocated, the engine frees its device memory while the ranks train (GPU engines only)
            sleep_mode=cfg.placement.colocate,
            placement=_ray_cluster(cfg) if cfg.placement.backend == "ray" else None,
        )

    return EngineSupervisor(start, cfg.engine.max_restarts, log=log)


def build_scoring_pool(cfg: RunConfig, log=print):
    """The verifier's worker pool; a worker's death is one line through `log` (the run's terminal)."""

    r = cfg.reward
    return ScoringPool(
        r.verifier,
        workers=r.workers,
        timeout_s=r.timeout_s,
        memory_limit_mb=r.memory_limit_mb,
        options=r.options,
        log=log,
    )


def sized_engine(cfg: RunConfig, prompt_sets: list[PromptSet], positions: int | None) -> RunConfig:
    """`cfg` with engine.max_model_len as the engine gets it (rlvr.rollout.prompts.engine_context)
    for a model of `positions` (rlvr.models.multimodal.max_positions of cfg.model.path), said here
    in rlvr's words before anything starts, not by vLLM once the ranks are up."""

    context = engine_context(
        prompt_sets,
        max_tokens=cfg.rollout.sampling.max_tokens,
        env=cfg.env,
        max_model_len=cfg.engine.max_model_len,
        positions=positions,
        model=cfg.model.path,
    )
    return cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"max_model_len": context})})


def _ray_cluster(cfg: RunConfig):

    return RayCluster.shared(cfg.placement, cfg.trainer.ranks, cfg.engine.replicas, cfg.engine.tensor_parallel_size)
