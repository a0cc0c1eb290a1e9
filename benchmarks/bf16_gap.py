"""The sampler/trainer logprob gap in bfloat16 against a stale push's: the noise the sync check
must pass, the signal it must catch, and the margin between them.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/bf16_gap.py configs/demo.yaml --steps 12 \
        --rlvr trainer.ranks=1 --out runs/bench/bf16_gap_demo.json
    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/bf16_gap.py configs/qwen0.5b_gsm8k_cpu.yaml --steps 4 \
        --rlvr rollout.samples_per_prompt=4 --rlvr rollout.sampling.max_tokens=128 --out runs/bench/bf16_gap_qwen.json

A recipe's run as `rlvr train` builds it (rlvr.orchestration.builders.build_run: its prompts,
verifier, GRPO advantages, trainer ranks, engine with the CPU's merged LoRA, WeightSync), once
per model.dtype (auto, then float32 for contrast), without a test set, the sync check's threshold
lifted so that nothing stops the measurement. Its schedule is the recipe's (cfg.steps): the
steps measured are the first `--steps` of the real run. Step t:

  - the engine, serving the adapter pushed after step t-1, generates and the verifier scores
    the step's batch;
  - on-policy gap: per trained token, |sampler logprob - trainer logprob| before the update
    (the mean is the step's sync/sampler_trainer_gap, which the check holds to the threshold);
  - the trainer updates on the batch;
  - stale gap: the same tokens scored by the trainer after the update, against the sampler's
    logprobs: what step t+1's sync/sampler_trainer_gap would be had push t not arrived; and the
    sync probe likewise (engine before the push, trainer after);
  - push t, probed (sync/logprob_gap, the other figure the check compares), and the probe's gap
    against the engine's scores of the untrained base (a push that never arrived at all).

Each dtype's verdict is at the threshold its run would use (engine.sync_check_threshold, or the
compute dtype's default where null); `--rlvr engine.sync_check_threshold=X` judges another.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from _ledger import append_line, provenance, write_result

DTYPES = ("auto", "float32")


def token_gaps(first: list[list[float]], second: list[list[float]], masks: list[list[int]] | None) -> list[float]:
    """|first - second| logprob of every trained token (loss mask 1; every completion token without one)."""
    masks = masks or [[1] * len(f) for f in first]
    return [
        abs(a - b)
        for f, s, m in zip(first, second, masks, strict=True)
        for a, b, keep in zip(f, s, m, strict=True)
        if keep
    ]


def distribution(values: list[float]) -> dict[str, float]:
    import torch

    x = torch.tensor(values, dtype=torch.float64)
    q = torch.quantile(x, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
    return {
        "tokens": len(values),
        "mean": x.mean().item(),
        "median": q[0],
        "p90": q[1],
        "p99": q[2],
        "max": x.max().item(),
    }


def adapter_change_rms(adapter) -> float:
    """RMS over every adapted weight of the adapter's change scale * B @ A: what the engine's merge
    adds to the base, and whose size sets the stochastic rounding's noise."""
    import torch

    config = adapter.config
    rank = int(config["r"])
    scale = float(config["lora_alpha"]) / (math.sqrt(rank) if config.get("use_rslora") else rank)
    squares, count = 0.0, 0
    for name, a in adapter.tensors.items():
        if name.endswith("lora_A.weight"):
            b = adapter.tensors[name.replace("lora_A", "lora_B")]
            change = scale * (b.float() @ a.float())
            squares += torch.sum(change.double() ** 2).item()
            count += change.numel()
    return math.sqrt(squares / count)


def measure(cfg, steps: int, log) -> dict:
    """The first `steps` RL steps of `cfg`'s run, gaps recorded as the module docstring says."""
    from rlvr.orchestration.builders import build_run
    from rlvr.planning.architecture import planned_dtype
    from rlvr.sync.check import logprob_gap, probe_inputs

    temperature = cfg.rollout.sampling.temperature
    per_step, on_policy, stale = [], [], []
    with ExitStack() as stack:
        started = time.perf_counter()
        run = build_run(cfg, stack, log=log)
        engine, trainer, sync = run.engine, run.trainer, run.sync
        probe_sequences, probe_lens = probe_inputs(sync.probe)
        sync.push(step=0)
        base_probe = engine.score_each(probe_sequences, probe_lens)
        startup = time.perf_counter() - started
        for step in range(1, steps + 1):
            step_start = time.perf_counter()
            rollouts = run.source.next(step)
            batch = rollouts.batch
            sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
            prompt_lens = [len(p) for p in batch.prompt_ids]
            before = trainer.logprobs(sequences, prompt_lens, temperature)
            metrics = trainer.train_step(batch, temperature)
            after = trainer.logprobs(sequences, prompt_lens, temperature)
            gaps = token_gaps(batch.sampler_logprobs, before, batch.loss_mask)
            stale_gaps = token_gaps(batch.sampler_logprobs, after, batch.loss_mask)
            on_policy += gaps
            stale += stale_gaps
            trainer_probe = trainer.logprobs(probe_sequences, probe_lens)
            stale_probe = max(
                logprob_gap(each, trainer_probe) for each in engine.score_each(probe_sequences, probe_lens)
            )
            pushed = sync.push(step, used_unchecked=True)
            per_step.append(
                {
                    "step": step,
                    "reward_mean": rollouts.metrics["reward/mean"],
                    "lr": metrics["lr"],
                    "grad_norm": metrics["grad_norm"],
                    "tokens": len(gaps),
                    "sync_gap": statistics.fmean(gaps),
                    "sync_gap_train_step": metrics["sync/sampler_trainer_gap"],
                    "stale_gap": statistics.fmean(stale_gaps),
                    # how far the update moved the trainer's own logprobs: the stale gap's signal, without the noise
                    "update_change": statistics.fmean(token_gaps(before, after, batch.loss_mask)),
                    "probe_gap": pushed["sync/logprob_gap"],
                    "stale_probe_gap": stale_probe,
                    "probe_gap_vs_base": max(logprob_gap(each, trainer_probe) for each in base_probe),
                    "adapter_change_rms": adapter_change_rms(sync.serving),
                    "seconds": round(time.perf_counter() - step_start, 1),
                }
            )
            log(
                f"[{cfg.model.dtype}] step {step}: "
                + ", ".join(f"{k} {v:.3g}" for k, v in per_step[-1].items() if k not in ("step", "tokens"))
            )
    return summarize(per_step, on_policy, stale) | {
        "compute_dtype": planned_dtype(cfg.model, cfg.placement).name,
        "probe_tokens": sum(len(c) for _, c in sync.probe),
        "startup_s": round(startup, 1),
        "per_step": per_step,
    }


def summarize(per_step: list[dict], on_policy: list[float], stale: list[float]) -> dict:
    """Noise (the on-policy and probe gaps after a push that arrived) against signal (the same
    figures one update stale): their extremes over the steps and the margin between them."""
    noise = {
        "sync_gap_max": max(s["sync_gap"] for s in per_step),
        "probe_gap_max": max(s["probe_gap"] for s in per_step),
    }
    signal = {
        "stale_gap_min": min(s["stale_gap"] for s in per_step),
        "stale_probe_gap_min": min(s["stale_probe_gap"] for s in per_step),
    }
    return {
        "token_gap": distribution(on_policy),
        "stale_token_gap": distribution(stale),
        "noise": noise,
        "stale": signal,
        "margin": {
            "sync_gap": signal["stale_gap_min"] / noise["sync_gap_max"],
            "probe_gap": signal["stale_probe_gap_min"] / noise["probe_gap_max"],
        },
        "trend": {
            key: [s[key] for s in per_step] for key in ("sync_gap", "probe_gap", "update_change", "adapter_change_rms")
        },
    }


def threshold_verdict(result: dict, threshold: float) -> dict:
    """Whether `threshold` passes every push that arrived and stops every one-update-stale one,
    on each of the two figures the check compares."""
    return {
        "threshold": threshold,
        "passes_noise": result["noise"]["sync_gap_max"] <= threshold and result["noise"]["probe_gap_max"] <= threshold,
        "stale_steps_caught_by_sync_gap": sum(s["stale_gap"] > threshold for s in result["per_step"]),
        "stale_steps_caught_by_probe": sum(s["stale_probe_gap"] > threshold for s in result["per_step"]),
        # an engine that got no push after the untrained base: caught once the drift exceeds the threshold
        "never_pushed_caught_at_step": next(
            (s["step"] for s in result["per_step"] if s["probe_gap_vs_base"] > threshold), None
        ),
        "steps": len(result["per_step"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="the recipe, as `rlvr train` takes it")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=4, help="RL steps measured per dtype")
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="model.dtype to measure (default: both)")
    parser.add_argument("--rlvr", action="append", default=[], metavar="KEY=VALUE", help="extra rlvr config override")
    args = parser.parse_args()

    from rlvr.config import ConfigError, load_config

    results, settings = {}, {}
    for dtype in args.dtype or DTYPES:
        with tempfile.TemporaryDirectory(prefix="bf16_gap-") as run_dir:
            overrides = [f"model.dtype={dtype}", "data.test=null", *args.rlvr]
            try:
                cfg = load_config(args.config, [*overrides, f"run_dir={run_dir}"])
            except ConfigError as err:
                print(err, file=sys.stderr)
                raise SystemExit(2) from None
            if not (Path(cfg.model.path) / "config.json").is_file():
                print(
                    f"{args.config}: model.path {cfg.model.path} is not built (docs/real_models.md, `rlvr demo`)",
                    file=sys.stderr,
                )
                raise SystemExit(2)
            engine = cfg.engine
            # measured, not enforced: a gap over the threshold is a figure here, not a stop
            cfg = cfg.model_copy(update={"engine": engine.model_copy(update={"sync_check_threshold": math.inf})})
            result = measure(cfg, args.steps, lambda line: print(line, flush=True))
        # the threshold the run would hold its gaps to: the recipe's, else the compute dtype's default
        result["threshold"] = threshold_verdict(result, engine.sync_threshold(result["compute_dtype"]))
        results[result["compute_dtype"]] = result
        settings = {
            "config": str(args.config),
            "overrides": overrides[1:],
            "model": cfg.model.path,
            "steps": args.steps,
            "recipe_steps": cfg.steps,
            "lr": cfg.trainer.lr,
            "schedule": cfg.trainer.schedule,
            "prompts_per_step": cfg.rollout.prompts_per_step,
            "samples_per_prompt": cfg.rollout.samples_per_prompt,
            "max_tokens": cfg.rollout.sampling.max_tokens,
            "temperature": cfg.rollout.sampling.temperature,
            "lora_rank": cfg.trainer.lora.rank if cfg.trainer.lora else None,
            "trainer_ranks": cfg.trainer.ranks,
            "merge_lora": cfg.engine.merge_lora,
        }
    write_result(args.out, {"setting": settings, "dtypes": results} | provenance())
    parts = []
    for name, r in results.items():
        t, v = r["token_gap"], r["threshold"]
        never = v["never_pushed_caught_at_step"]
        parts.append(
            f"**{name}**: per-token gap median {t['median']:.2g} / p99 {t['p99']:.2g} / max {t['max']:.2g}; per-step "
            f"mean (sync_gap) max {r['noise']['sync_gap_max']:.2g}, probe max {r['noise']['probe_gap_max']:.2g}; "
            f"one update stale: mean min {r['stale']['stale_gap_min']:.2g}, probe min "
            f"{r['stale']['stale_probe_gap_min']:.2g}, the update itself moving the trainer's logprobs by "
            f"{min(r['trend']['update_change']):.2g}-{max(r['trend']['update_change']):.2g} (mean); margin {r['margin']['sync_gap']:.1f}x (mean) / "
            f"{r['margin']['probe_gap']:.1f}x (probe); sync_gap by step "
            f"{', '.join(f'{g:.2g}' for g in r['trend']['sync_gap'])}; threshold {v['threshold']:g} "
            f"{'passes' if v['passes_noise'] else 'FAILS'} the noise, catches {v['stale_steps_caught_by_sync_gap']}/"
            f"{v['steps']} stale steps by the mean, {v['stale_steps_caught_by_probe']}/{v['steps']} by the probe, "
            f"an engine never pushed to after the base {f'at step {never}' if never else 'in none'}"
        )
    s = settings
    append_line(
        f"sampler/trainer logprob gap, {s['config']} ({s['model']}: LoRA r{s['lora_rank']} merged into the "
        f"engine, {s['trainer_ranks']} rank, {s['prompts_per_step']} prompts x {s['samples_per_prompt']} samples x "
        f"{s['max_tokens']} tokens, lr {s['lr']:g} {s['schedule']}, first {s['steps']} of {s['recipe_steps']} steps): "
        + "; ".join(parts),
        {"setting": settings} | provenance(),
    )


if __name__ == "__main__":
    main()
