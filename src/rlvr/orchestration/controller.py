"""The controller: one process that runs the RL loop over the stage interfaces.

    prompts -> engine.generate -> pool.score -> advantages -> trainer.train_step -> sync

`train(cfg)` is the whole loop; it knows the engine, the scoring pool, the trainer and the
tracker only by their methods, so each can be swapped (vLLM or HF, local or remote ranks)
without touching it.

With `rollout.max_staleness: 1` the loop is one step off-policy: the ranks train step t while
the engine, still serving the policy of step t-1, generates the rollouts of step t+1; the
trainer corrects for the lag with truncated importance sampling (`algorithm.tis_cap`).
"""

from __future__ import annotations

import json
import math
import random
import signal
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from rlvr.config import DataConfig, RunConfig, dump_config
from rlvr.orchestration import RunStopped
from rlvr.records import Problem, Sampling, TrainBatch


@dataclass
class PromptSet:
    """Problems and their tokenised prompts, index-aligned."""

    problems: list[Problem]
    prompts: list[list[int]]


@dataclass
class StepRollouts:
    """One step's scored rollouts, ready for the trainer."""

    batch: TrainBatch
    metrics: dict[str, float]  # reward/*, response/*, score/*
    data_position: int  # the prompt sampler's position before this step's prompts were taken


class EpochSampler:
    """Prompts in a seeded random order, epoch after epoch; `position` is all the state."""

    def __init__(self, size: int, seed: int, position: int = 0):
        self.size, self.seed, self.position = size, seed, position

    def take(self, count: int) -> list[int]:
        out = []
        for _ in range(count):
            epoch, offset = divmod(self.position, self.size)
            order = list(range(self.size))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            out.append(order[offset])
            self.position += 1
        return out


def train(cfg: RunConfig, progress=None, resume: bool = False, log=print) -> dict:
    """Run cfg.steps RL steps; write metrics.jsonl and summary.json under cfg.run_dir.

    With `resume`, continue from the newest intact checkpoint in cfg.run_dir."""
    from transformers import AutoTokenizer

    from rlvr.checkpoint.peft_files import load_adapter, save_adapter
    from rlvr.checkpoint.store import CheckpointStore, read_state
    from rlvr.engines import make_engine
    from rlvr.engines.sync_check import SyncCheck
    from rlvr.orchestration.engine_supervisor import EngineSupervisor
    from rlvr.rewards import ScoringPool
    from rlvr.tracking.metrics_log import MetricsLogger
    from rlvr.tracking.timing import StepTimer

    started = time.time()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    torch.manual_seed(cfg.seed)

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    train_set = _prompt_set(cfg, cfg.data.train, tokenizer)
    test_set = _prompt_set(cfg, cfg.data.test, tokenizer, limit=cfg.eval.max_problems) if cfg.data.test else None
    sampler = EpochSampler(len(train_set.problems), cfg.seed)
    sampling = Sampling(
        temperature=cfg.rollout.sampling.temperature,
        top_p=cfg.rollout.sampling.top_p,
        max_tokens=cfg.rollout.sampling.max_tokens,
        stop=tuple(cfg.rollout.sampling.stop),
    )
    timer = StepTimer()
    summary: dict = {"model": cfg.model.path, "steps": cfg.steps, "seed": cfg.seed}
    store = CheckpointStore(run_dir, keep=cfg.checkpoint.keep, log=log)
    resume_from = store.latest() if resume else None
    if resume and resume_from is None:
        raise ValueError(f"{run_dir}: no intact checkpoint to resume from")

    with ExitStack() as stack:
        trainer = stack.enter_context(_make_trainer(cfg))
        engine = stack.enter_context(
            EngineSupervisor(
                lambda: _make_engine(cfg, partial(make_engine, in_process=cfg.engine.in_process)),
                cfg.engine.max_restarts,
                log=log,
            )
        )
        pool = stack.enter_context(
            ScoringPool(
                cfg.reward.verifier,
                workers=cfg.reward.workers,
                timeout_s=cfg.reward.timeout_s,
                memory_limit_mb=cfg.reward.memory_limit_mb,
            )
        )
        logger = stack.enter_context(MetricsLogger(run_dir, cfg.tracking.backends, config=cfg.model_dump(mode="json")))
        probe = _sync_probe(train_set, tokenizer)
        sync_check = SyncCheck(cfg.engine.sync_check_threshold)

        last_adapter = None
        rollout_adapter = None  # the one before last_adapter: what generated the in-flight rollouts

        def sync(step: int) -> dict[str, float]:
            nonlocal last_adapter, rollout_adapter
            with timer("sync"):
                if cfg.trainer.lora:
                    rollout_adapter, last_adapter = last_adapter, trainer.adapter()
                    engine.update_lora(last_adapter)
                else:
                    engine.update_weights(trainer.weights().items())
                gap = sync_check.measure(engine, trainer.logprobs, probe, step=step)
            return {"sync/logprob_gap": gap}

        def run_eval(step: int, tag: str) -> dict:
            if test_set is None:
                return {}
            with timer("eval"):
                result = _evaluate(cfg, engine, pool, test_set, run_dir / "eval" / f"{tag}.jsonl", progress)
            (run_dir / "eval" / f"{tag}.json").write_text(json.dumps(result, indent=2))
            return result

        def checkpoint(step: int, in_flight: StepRollouts | None) -> None:
            def write_parts(folder: Path) -> None:
                (folder / "trainer").mkdir()
                trainer.save(folder / "trainer")
                if last_adapter is not None:
                    save_adapter(last_adapter, folder / "adapter")
                if cfg.rollout.max_staleness and rollout_adapter is not None:
                    save_adapter(rollout_adapter, folder / "rollout_adapter")

            # Rollouts generated ahead are not saved: a resumed run generates them again, from
            # the same prompts (the position before them), seed and adapter (rollout_adapter).
            position = in_flight.data_position if in_flight is not None else sampler.position
            with timer("checkpoint"):
                state = {"step": step, "data_position": position, "eval_before": summary["eval_before"]}
                store.save(step, state, write_parts)

        def rollout(step: int) -> StepRollouts:
            return _collect_rollouts(cfg, step, engine, pool, train_set, sampler, sampling, timer, progress)

        start = 0
        pending = None  # the next step's rollouts, generated while this step trained
        if resume_from is not None:
            state = read_state(resume_from)
            trainer.load(resume_from / "trainer")
            start, sampler.position = state["step"], state["data_position"]
            summary["eval_before"] = state["eval_before"]
            logger.truncate_after(start, redone="eval_after/")  # a run killed in its final eval does it again
            log(f"resuming from {resume_from} (step {start})")
            if cfg.rollout.max_staleness and (resume_from / "rollout_adapter").is_dir() and start < cfg.steps:
                last_adapter = load_adapter(resume_from / "rollout_adapter", version=0)
                engine.update_lora(last_adapter)
                pending = rollout(start + 1)  # exactly the rollouts the interrupted run had in flight
        sync(step=start)
        summary["engine"] = engine.name
        summary["trainer_ranks"] = trainer.world_size
        summary["base_format"] = trainer.base_format
        summary["trainer_attention"] = "packed" if trainer.packed_attention else "sdpa"
        if cfg.trainer.attention == "packed" and not trainer.packed_attention:
            log(f"trainer.attention: packed is not available for {cfg.model.path} (its attention does not dispatch "
                "through transformers' AttentionInterface): training with sdpa's block-diagonal mask and a prompt "
                "copy per sample")
        summary["lora_rank"] = int(last_adapter.config["r"]) if last_adapter is not None else None
        if resume_from is None:
            summary["eval_before"] = _headline(run_eval(0, "before"), cfg)
            logger.log(0, {f"eval/{k}": v for k, v in summary["eval_before"].items()} | timer.pop_metrics())

        stop_signal = stack.enter_context(_stop_requests())
        # Colocated and synchronous, the engine is idle while the ranks train on the same devices,
        # so it sleeps (a no-op where the backend cannot); generating ahead, it must stay awake.
        sleep_while_training = cfg.placement.colocate and not cfg.rollout.max_staleness
        consecutive_skips = 0
        for step in range(start + 1, cfg.steps + 1):
            step_start = time.perf_counter()
            current = pending or rollout(step)
            if sleep_while_training:
                engine.sleep()
            trainer.start_train_step(current.batch, temperature=sampling.temperature)
            training_start = time.perf_counter()
            ahead = cfg.rollout.max_staleness and step < cfg.steps and not stop_signal
            pending = rollout(step + 1) if ahead else None  # the engine works while the ranks train
            generated_ahead = time.perf_counter() - training_start
            metrics = trainer.finish_train_step()
            if sleep_while_training:
                engine.wake()
            metrics |= _overlap(generated_ahead, metrics["time/train"], time.perf_counter() - training_start)
            metrics |= sync(step)
            metrics |= current.metrics | {"engine/restarts": engine.restarts}
            consecutive_skips = consecutive_skips + 1 if metrics["skipped"] else 0
            if consecutive_skips:
                log(f"step {step}: grad_norm={metrics['grad_norm']}, optimizer step skipped ({consecutive_skips} in a row)")
            if consecutive_skips >= cfg.trainer.max_consecutive_skips:
                logger.log(step, metrics | timer.pop_metrics())
                raise RunStopped(
                    f"trainer.max_consecutive_skips={cfg.trainer.max_consecutive_skips}: steps {step - consecutive_skips + 1}"
                    f"-{step} had a non-finite loss or gradient; stopped, last checkpoint {store.latest(verbose=False)}"
                )
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.steps:
                metrics |= {f"eval/{k}": v for k, v in _headline(run_eval(step, f"step{step}"), cfg).items()}
            stopping = bool(stop_signal) and step < cfg.steps
            if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or step == cfg.steps or stopping:
                checkpoint(step, pending)
            step_seconds = time.perf_counter() - step_start
            generated = sum(len(c) for c in current.batch.completion_ids)
            metrics |= timer.pop_metrics() | {"time/step": step_seconds, "throughput/tokens_per_s": generated / step_seconds}
            logger.log(step, metrics)
            if progress is not None:
                progress(step, metrics)
            if stopping:
                log(f"{stop_signal[0]}: stopped after step {step}, checkpoint written; continue with --resume")
                summary["stopped_after_step"] = step
                break
        else:
            summary["eval_after"] = _headline(run_eval(cfg.steps, "after"), cfg)
            logger.log(cfg.steps, {f"eval_after/{k}": v for k, v in summary["eval_after"].items()} | timer.pop_metrics())

    summary["wall_seconds"] = round(time.time() - started, 1)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


# ---------------------------------------------------------------------- pieces


def _collect_rollouts(
    cfg: RunConfig, step: int, engine, pool, train_set: PromptSet, sampler: EpochSampler, sampling: Sampling, timer,
    progress=None,
) -> StepRollouts:
    """Generate, score and weigh (advantages) the rollouts of `step`: its seed is the step's, so
    the same prompts under the same weights give the same rollouts whenever they are generated."""
    from rlvr.algorithms import advantages
    from rlvr.tracking.progress import phase

    position = sampler.position
    chosen = sampler.take(cfg.rollout.prompts_per_step)
    with timer("generate"):
        rollouts = engine.generate(
            [train_set.prompts[i] for i in chosen],
            cfg.rollout.samples_per_prompt,
            replace(sampling, seed=cfg.seed * 100_003 + step),
            progress=phase(progress, "generate", len(chosen) * cfg.rollout.samples_per_prompt),
        )
    with timer("score"):
        answers = [train_set.problems[chosen[r.prompt_index]].answer for r in rollouts]
        scores = pool.score([r.text for r in rollouts], answers, progress=phase(progress, "score", len(rollouts)))
    bad = next((i for i, s in enumerate(scores) if not math.isfinite(s.reward)), None)
    if bad is not None:  # as in eval: a NaN would silently turn the whole group's advantages to NaN
        problem = train_set.problems[chosen[rollouts[bad].prompt_index]].id
        raise ValueError(f"reward.verifier={cfg.reward.verifier}: reward must be a finite number, got "
                         f"{scores[bad].reward!r} (problem {problem!r})")
    rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    group = torch.tensor([r.prompt_index for r in rollouts], dtype=torch.long)
    batch = TrainBatch(
        prompt_ids=[r.prompt_ids for r in rollouts],
        completion_ids=[r.completion_ids for r in rollouts],
        sampler_logprobs=[r.logprobs for r in rollouts],
        advantages=advantages(cfg.algorithm.advantage, rewards, group, std_normalize=cfg.algorithm.std_normalize),
        group=group,
    )
    lengths = [len(r.completion_ids) for r in rollouts]
    metrics = {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "response/length_mean": sum(lengths) / len(lengths),
        "response/length_max": max(lengths),
        "response/truncated_fraction": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
        "score/no_answer_fraction": sum(s.status == "no_answer" for s in scores) / len(scores),
        "data/position": sampler.position,
    }
    return StepRollouts(batch, metrics, position)


def _overlap(generated_ahead: float, train_seconds: float, training_wall: float) -> dict[str, float]:
    """time/overlap: seconds in which the engine (generating ahead) and the ranks (training) both
    worked; generate + train - overlap is the wall time the two took together."""
    return {"time/overlap": max(0.0, generated_ahead + train_seconds - training_wall)}


@contextmanager
def _stop_requests():
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


def encode_prompt(problem: Problem, tokenizer, data: DataConfig) -> list[int]:
    """The prompt's token ids: the template, in the tokenizer's chat template if asked."""
    from rlvr.data.templates import build_prompt

    text = build_prompt(problem, tokenizer if data.chat_template else None, data.template)
    return tokenizer(text, add_special_tokens=False).input_ids


def _prompt_set(cfg: RunConfig, source: str, tokenizer, limit: int | None = None) -> PromptSet:
    from rlvr.data.datasets import load_problems

    problems = load_problems(
        source, problem_field=cfg.data.problem_field, answer_field=cfg.data.answer_field, limit=limit
    )
    prompts = [encode_prompt(p, tokenizer, cfg.data) for p in problems]
    too_long = next((p.id for p, ids in zip(problems, prompts) if len(ids) > cfg.data.max_prompt_tokens), None)
    if too_long is not None:
        raise ValueError(f"{source}: problem {too_long} is longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    return PromptSet(problems, prompts)


def _make_trainer(cfg: RunConfig):
    from rlvr.training.trainer import Trainer
    from rlvr.training.worker import RankSpec

    t = cfg.trainer
    spec = RankSpec(
        model_path=cfg.model.path,
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        lr=t.lr,
        betas=tuple(t.betas),
        weight_decay=t.weight_decay,
        warmup_steps=t.warmup_steps,
        schedule=t.schedule,
        total_steps=cfg.steps,
        grad_clip=t.grad_clip,
        gradient_checkpointing=t.gradient_checkpointing,
        attention=t.attention,
        lora=t.lora.model_dump() if t.lora else None,
        algorithm=cfg.algorithm.model_dump(),
    )
    launch = None
    if cfg.placement.backend == "ray":
        from rlvr.orchestration.ray_placement import RayCluster

        launch = RayCluster.shared(cfg.placement, t.ranks).launch_ranks
    return Trainer(
        spec, ranks=t.ranks, micro_batch_tokens=t.micro_batch_tokens, share_prompts=t.share_prompts, launch=launch
    )


def engine_model_path(model_path: str) -> str:
    """What the engine loads. An NVFP4 checkpoint runs natively where vLLM has NVFP4 kernels
    (CUDA); elsewhere, and for NF4 always (vLLM 0.32 has no bitsandbytes method), the engine
    gets the dequantized values, written once beside it, which are exactly the numbers the
    trainer's packed layers compute with."""
    import torch

    from rlvr.quant.checkpoint import is_quantized_checkpoint, quantized_format, write_dequantized_checkpoint

    if not is_quantized_checkpoint(model_path):
        return model_path
    if torch.cuda.is_available() and quantized_format(model_path) == "nvfp4":
        return model_path
    view = Path(str(model_path).rstrip("/") + ".dequantized")
    if not (view / "model.safetensors").is_file():  # written last
        write_dequantized_checkpoint(model_path, view)
    return str(view)


def _make_engine(cfg: RunConfig, make_engine):
    e = cfg.engine
    placement = None
    if cfg.placement.backend == "ray":
        from rlvr.orchestration.ray_placement import RayCluster

        placement = RayCluster.shared(cfg.placement, cfg.trainer.ranks)
    return make_engine(
        e.backend,
        engine_model_path(cfg.model.path),
        dtype=cfg.model.dtype,
        max_model_len=e.max_model_len,
        enable_lora=cfg.trainer.lora is not None,
        max_lora_rank=cfg.trainer.lora.rank if cfg.trainer.lora else 16,
        tensor_parallel_size=e.tensor_parallel_size,
        kv_cache_gb=e.kv_cache_gb,
        enable_prefix_caching=e.enable_prefix_caching,
        enforce_eager=e.enforce_eager,
        block_size=e.block_size,
        num_threads=e.num_threads,
        seed=cfg.seed,
        # colocated, the engine frees its device memory while the ranks train (GPU engines only)
        enable_sleep_mode=cfg.placement.colocate,
        placement=placement,
    )


def _sync_probe(train_set: PromptSet, tokenizer) -> list[tuple[list[int], list[int]]]:
    """A fixed probe: the first prompts with a fixed completion (their reference answers)."""
    probe = []
    for problem, prompt in list(zip(train_set.problems, train_set.prompts))[:4]:
        completion = tokenizer(f"\\boxed{{{problem.answer}}}", add_special_tokens=False).input_ids
        probe.append((prompt, completion))
    return probe


def _evaluate(cfg: RunConfig, engine, pool, test_set: PromptSet, samples_path: Path, progress=None) -> dict:
    from rlvr.eval.runner import evaluate

    sampling = Sampling(
        temperature=cfg.eval.temperature,
        top_p=1.0,
        max_tokens=cfg.rollout.sampling.max_tokens,
        stop=tuple(cfg.rollout.sampling.stop),
        seed=cfg.seed,
    )
    samples_path.parent.mkdir(parents=True, exist_ok=True)
    return evaluate(
        engine, pool, test_set.problems, test_set.prompts, n=cfg.eval.n, ks=cfg.eval.k, sampling=sampling,
        samples_path=str(samples_path), progress=progress,
    )


def _headline(result: dict, cfg: RunConfig) -> dict[str, float]:
    keys = [f"{m}@{k}" for k in cfg.eval.k for m in ("avg", "pass", "maj")]
    return {k: round(float(result[k]), 4) for k in keys if k in result}

