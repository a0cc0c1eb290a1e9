"""Scored items per second through the ScoringPool, on realistic 1-2 KB math responses.

Responses are MATH-500 worked solutions (each ends in a `\\boxed{}` answer), trimmed or padded
with their own text to 1-2 KB. Half are scored against their own reference (reward 1), half
against another problem's (reward 0, which cannot take the string fast path). Responses are
all distinct, but with more items than MATH-500 problems the extracted answers repeat (as
samples of one prompt do in RL), so the per-worker parse caches help from the second pass on.
Items go through the pool in RL-sized steps (`--step`, default 128); start-up is timed apart.

    python benchmarks/scoring.py --out runs/bench_scoring.json

appends a line to docs/benchmarks.md (command, machine, date, figures).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from _ledger import append_line, provenance, write_result

from rlvr.data.datasets import builtin_path
from rlvr.rewards import ScoringPool


def make_items(count: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    rows = [json.loads(line) for line in builtin_path("math500").open()]
    problems = [r for r in rows if "\\boxed" in r["solution"]]
    responses, answers = [], []
    for i in range(count):
        problem = problems[i % len(problems)]
        text = problem["solution"]
        while len(text) < 1024:
            text = text + "\n" + text
        # Keep the end (the boxed answer) and a 1-2 KB window before it.
        text = text[-rng.randint(1024, 2048) :] + f"\n(sample {i})"
        wrong = i % 2 == 1
        answer = (
            problems[(i + 1 + rng.randrange(len(problems) - 1)) % len(problems)]["answer"]
            if wrong
            else problem["answer"]
        )
        responses.append(text)
        answers.append(answer)
    return responses, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    parser.add_argument("--items", type=int, default=2048)
    parser.add_argument("--step", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    responses, answers = make_items(args.items, args.seed)
    started = time.perf_counter()
    with ScoringPool("math", workers=args.workers, timeout_s=args.timeout_s) as pool:
        pool.wait_ready()
        startup_s = time.perf_counter() - started
        t0 = time.perf_counter()
        scores = []
        for i in range(0, len(responses), args.step):
            scores += pool.score(responses[i : i + args.step], answers[i : i + args.step])
        elapsed = time.perf_counter() - t0
    statuses = {s: sum(x.status == s for x in scores) for s in ("ok", "no_answer", "timeout", "error")}
    result = {
        "items": len(scores),
        "items_per_s": round(len(scores) / elapsed, 1),
        "seconds": round(elapsed, 2),
        "startup_s": round(startup_s, 2),
        "mean_response_chars": round(sum(map(len, responses)) / len(responses)),
        "reward_mean": round(sum(s.reward for s in scores) / len(scores), 3),
        "statuses": statuses,
        "workers": args.workers,
        "step": args.step,
    } | provenance()
    write_result(args.out, result)
    append_line(
        f"scoring pool (math verifier, {args.workers} workers, steps of {args.step}, "
        f"~{result['mean_response_chars']}-char responses): **{result['items_per_s']} items/s**, "
        f"start-up {result['startup_s']} s, statuses {statuses}",
        result,
    )


if __name__ == "__main__":
    main()
