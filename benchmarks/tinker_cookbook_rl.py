"""tinker-cookbook's RL recipe, unmodified, against `rlvr serve`: does the correct rate rise, by
more than its noise?

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/tinker_cookbook_rl.py --out runs/bench/tinker_cookbook_rl.json

`make smollm2`'s NVFP4 SmolLM2-135M-Instruct is the default base (LoRA on the frozen 4-bit
weights, vLLM sampling); the recipe is `tinker_cookbook.recipes.math_rl.train env=arithmetic`
(sums of two numbers 0-100, with the recipe's one-shot example "What is 4 + 5?" -> "9"), run as
its README says, with `qwen3_instruct` as the renderer: ChatML, which stops on the `<|im_end|>`
token id. The recipe's step i trains on the sums its ArithmeticDataset draws with seed i.

Significance. The recipe's own curve (each step's correct rate over groups_per_batch x
group_size samples) cannot be paired: every step draws other sums, and a step's samples share
their few problems. So the benchmark also scores a fixed held-out set through the same server,
before and after the run: `--eval-problems` sums drawn with `--eval-seed`, none of them one the
run trains on (the recipe's own dataset lists those), each prompted as the recipe prompts it,
sampled `--eval-samples` times at the recipe's temperature (1.0) and max_tokens with the same
seeds before and after, and scored by the recipe's ArithmeticEnv. Before: a fresh LoRA adapter
of the run's rank (zero-initialised, so the base itself); after: the run's final checkpoint,
loaded from its saved state. Paired by problem: d_i = (after's correct rate on sum i) -
(before's); the figure is mean(d) with the standard error sd(d) / sqrt(n), and the rise counts
when mean(d) >= 2 SE. For the recipe's own curve, the first- and last-quarter means with a
two-sample standard error over steps (each step's rate one draw: steps see independent sums),
for reference.

Written: each step's reward and accuracy as the recipe logged them, the quarters, the held-out
before/after rates with the paired figure, the wall times, the server's request-log lines. And
memory: each trainer rank's peak private memory (RssAnon, sampled every 5 ms from outside) and
the server process's (controller and in-process vLLM engine), against the plan's estimate of the
served run (rlvr.serve.model.planned_bytes' plan, per rank the plan's trainer column).
`--set KEY=VALUE` sets a key of the served config (the serve YAML).

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/tinker_cookbook_rl.py --out runs/bench/tinker_cookbook_rl_qwen.json \
        --model artifacts/qwen2.5-coder-0.5b/nvfp4 --max-tokens 8 --set trainer.gradient_checkpointing=true
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import numpy as np
import tinker
from _cookbook import API_KEY, Served, final_checkpoint, planned, quarters, run_recipe, served_arguments, serving
from _ledger import append_line, provenance, write_result
from tinker_cookbook import renderers
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset, ArithmeticEnv
from tinker_cookbook.tokenizer_utils import get_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RECIPE_TEMPERATURE = 1.0  # math_rl's CLIConfig default, which the benchmark leaves as it is


def trained_sums(renderer: renderers.Renderer, steps: int, groups: int, group_size: int) -> set[tuple[int, int]]:
    """The (x, y) the recipe trains on in `steps` steps, as its own dataset draws them."""
    dataset = ArithmeticDataset(batch_size=groups, renderer=renderer, group_size=group_size, n_batches=steps)
    return {builder.env_thunk.args[:2] for i in range(steps) for builder in dataset.get_batch(i)}  # type: ignore[attr-defined]


def held_out(count: int, seed: int, exclude: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """`count` distinct sums of two numbers 0-100 (the recipe's range), none in `exclude`."""
    rng = np.random.RandomState(seed)
    chosen: list[tuple[int, int]] = []
    while len(chosen) < count:
        pair = (int(rng.randint(0, 101)), int(rng.randint(0, 101)))
        if pair not in exclude and pair not in chosen:
            chosen.append(pair)
    return chosen


def correct_rates(
    sampler: tinker.SamplingClient,
    renderer: renderers.Renderer,
    sums: list[tuple[int, int]],
    samples: int,
    max_tokens: int,
    seed: int,
) -> list[float]:
    """Each sum's share of `samples` answers the recipe's ArithmeticEnv scores correct. Sum i's
    answers are drawn with the seeds seed + i x samples onwards (the server gives the j-th sample
    seed + j), the same before and after: where the policy did not change, neither does the
    answer, so the paired difference holds the change and less of the sampling's noise."""

    def params(offset: int) -> tinker.SamplingParams:
        return tinker.SamplingParams(
            max_tokens=max_tokens,
            stop=renderer.get_stop_sequences(),
            temperature=RECIPE_TEMPERATURE,
            seed=seed + offset,
        )

    async def score() -> list[float]:
        envs = [ArithmeticEnv(x, y, renderer, convo_prefix=ArithmeticEnv.standard_fewshot_prefix()) for x, y in sums]
        prompts = [(await env.initial_observation())[0] for env in envs]
        answers = await asyncio.gather(
            *(sampler.sample_async(prompt, samples, params(i * samples)) for i, prompt in enumerate(prompts))
        )
        rates = []
        for env, answer in zip(envs, answers):
            steps = [await env.step(sequence.tokens) for sequence in answer.sequences]
            rates.append(sum(step.metrics["correct"] for step in steps) / len(steps))
        return rates

    return asyncio.run(score())


def evaluate(served: Served, model: str, state_path: str | None, rank: int, score) -> tuple[list[float], float]:
    """The held-out rates of a fresh adapter (state_path None) or of a saved state, in a session of
    its own that ends before this returns: (rates, seconds)."""
    start = time.monotonic()
    ended = served.sessions_ended()
    service = tinker.ServiceClient(base_url=served.base_url, api_key=API_KEY)
    if state_path is None:
        training = service.create_lora_training_client(base_model=model, rank=rank).result()
    else:
        training = service.create_training_client_from_state(state_path).result()
    rates = score(training.save_weights_and_get_sampling_client().result())
    service.close("success").result()
    served.wait_sessions_ended(ended + 1)
    return rates, time.monotonic() - start


def paired(before: list[float], after: list[float]) -> dict:
    """mean(after - before) over problems, its standard error, and how many SE it is."""
    diffs = [a - b for a, b in zip(after, before)]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / len(diffs) ** 0.5
    return {"rise": round(mean, 4), "se": round(se, 4), "rise_over_se": round(mean / se, 2) if se else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=str(ROOT / "artifacts/smollm2/nvfp4"))
    parser.add_argument("--renderer", default="qwen3_instruct")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups", type=int, default=8, help="groups_per_batch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--max-tokens", type=int, default=5, help="the recipe's default: an answer and its stop token")
    parser.add_argument("--eval-problems", type=int, default=256, help="held-out sums scored before and after")
    parser.add_argument("--eval-samples", type=int, default=8, help="answers sampled for each held-out sum")
    parser.add_argument("--eval-seed", type=int, default=1_000_003, help="draws the held-out sums and their answers")
    args = served_arguments(parser, port=18931)

    renderer = renderers.get_renderer(args.renderer, get_tokenizer(args.model))
    sums = held_out(
        args.eval_problems, args.eval_seed, trained_sums(renderer, args.steps, args.groups, args.group_size)
    )

    def score(sampler: tinker.SamplingClient) -> list[float]:
        return correct_rates(sampler, renderer, sums, args.eval_samples, args.max_tokens, args.eval_seed)

    options = [
        f"model_name={args.model}",
        f"renderer_name={args.renderer}",
        "env=arithmetic",
        "loss_fn=importance_sampling",
        f"groups_per_batch={args.groups}",
        f"group_size={args.group_size}",
        f"max_steps={args.steps}",
        f"learning_rate={args.lr}",
        f"lora_rank={args.rank}",
        f"max_tokens={args.max_tokens}",
        "eval_every=0",
        "save_every=0",
        "behavior_if_log_dir_exists=delete",
    ]
    with serving("tinker_cookbook_rl_", args.port, {args.model: args.model}, args.alpha, args.settings) as served:
        plan_rank, plan_all, dtype = planned(served.config, args.model, args.rank)
        before, before_s = evaluate(served, args.model, None, args.rank, score)
        ended = served.sessions_ended()
        wall, logged = run_recipe(served, "tinker_cookbook.recipes.math_rl.train", options)
        served.wait_sessions_ended(ended + 1)  # the recipe's own, whether it finished it or it timed out
        after, after_s = evaluate(served, args.model, final_checkpoint(served)["state_path"], args.rank, score)
        memory = served.memory_result()
        server_log = served.server_lines()
    steps = [s for s in logged if "env/all/reward/total" in s]
    reward = [round(s["env/all/reward/total"], 4) for s in steps]
    correct = [round(s["env/all/correct"], 4) for s in steps]
    held = paired(before, after)
    result = {
        **provenance(),
        "model": args.model,
        "renderer": args.renderer,
        "steps": len(steps),
        "groups_per_batch": args.groups,
        "group_size": args.group_size,
        "learning_rate": args.lr,
        "lora_rank": args.rank,
        "max_tokens": args.max_tokens,
        "reward": reward,
        "correct": correct,
        "reward_quarters": quarters(reward),
        "correct_quarters": quarters(correct),
        "held_out": {
            "problems": len(sums),
            "samples_each": args.eval_samples,
            "seed": args.eval_seed,
            "before": round(statistics.fmean(before), 4),
            "after": round(statistics.fmean(after), 4),
            **held,
            "before_s": round(before_s, 1),
            "after_s": round(after_s, 1),
        },
        "wall_s": round(wall, 1),
        "s_per_step": round(wall / max(1, len(steps)), 1),
        "served_config": args.settings,
        "compute_dtype": dtype,
        **memory,
        "plan_rank_gb": round(plan_rank / 1e9, 3),
        "plan_all_gb": round(plan_all / 1e9, 3),
        "server_log": server_log,
    }
    rank_peak = max(result["rank_peak_private_gb"], default=0.0)
    result["plan_rank_over_measured"] = round(result["plan_rank_gb"] / rank_peak, 3) if rank_peak else None
    write_result(args.out, result)
    c = result["correct_quarters"]
    append_line(
        f"tinker-cookbook math_rl env=arithmetic, unmodified, against `rlvr serve` ({Path(args.model).name} "
        f"{Path(args.model).parent.name}, {dtype}, LoRA r{args.rank}, renderer {args.renderer}, {args.groups}x{args.group_size} "
        f"samples a step, lr {args.lr:g}, {len(steps)} steps): held-out correct rate (paired, {len(sums)} sums x "
        f"{args.eval_samples} samples) **{result['held_out']['before']:.3f} -> {result['held_out']['after']:.3f}, "
        f"rise {held['rise']:+.3f} +- {held['se']:.3f} ({held['rise_over_se']} SE)**; the recipe's accuracy, first vs last "
        f"quarter, {c['first_quarter']:.3f} -> {c['last_quarter']:.3f} ({c['rise_over_se']} SE over steps); {wall:.0f} s "
        f"({result['s_per_step']} s a step); peak private memory: trainer rank"
        f"{'s' * (len(result['rank_peak_private_gb']) > 1)} **{', '.join(f'{g:.2f}' for g in result['rank_peak_private_gb'])} GB** "
        f"against the plan's {result['plan_rank_gb']:.2f} GB, server process {result['server_peak_private_gb']:.2f} GB",
        result,
    )


if __name__ == "__main__":
    main()
