"""The Qwen2.5-Coder instruct models on the benchmarks their makers report, through `rlvr eval`.

    python benchmarks/published_evals.py --out runs/bench/published_evals.json                   # 0.5B: all three
    python benchmarks/published_evals.py --models 1.5b --benchmarks humaneval --out runs/bench/pe15.json
    python benchmarks/published_evals.py --limit 20 --out runs/bench/pe_smoke.json             # a quick look

Each (model, benchmark) is one `rlvr eval` of the imported float folder (`make qwen`, or
`make qwen QWEN=1.5b`: the official Q4_K_M weights, dequantized) with the decoding the makers'
evaluations use: greedy, one sample per problem, zero-shot, each set's own prompt (`data.template:
auto`: EvalPlus's instruction and the stub in a ```python fence for HumanEval; Qwen2.5-Math's
"Please reason step by step, and put your final answer within \\boxed{}." after the question for
GSM8K and MATH-500, the harness's `qwen-boxed` prompt) and its answer length (768 new tokens for
code, 2048 for math as Qwen2.5-Math's `max_tokens_per_call`). It records rlvr's figure with its
standard error beside the published one, the problems, the wall time and the verifier's statuses
(how many answers held none it could read), and appends one ledger line per row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from _ledger import append_line, provenance, write_result

ROOT = Path(__file__).resolve().parents[1]

# new tokens per benchmark; every row is greedy, one sample per problem
BENCHMARKS = {"humaneval": 768, "gsm8k": 2048, "math500": 2048}

# The makers' figures, pass@1 greedy: HumanEval from the Qwen2.5-Coder technical report's instruct
# table (arXiv 2409.12186), as a third-party model index transcribes it. The report's math table
# for the instruct models could not be read offline; None where no figure for that model was found
# (docs/real_models.md says which sibling's figure stands beside it).
PUBLISHED = {
    ("0.5b", "humaneval"): 0.616,
    ("1.5b", "humaneval"): 0.707,
}


def run_row(model: str, benchmark: str, limit: int | None, out_dir: Path) -> dict:
    folder = ROOT / "artifacts" / f"qwen2.5-coder-{model}" / "hf"
    if not (folder / "config.json").is_file():
        raise SystemExit(f"error: {folder}: not built; run `make qwen QWEN={model}` first")
    out = out_dir / f"{model}_{benchmark}.json"
    command = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "eval",
        str(folder),
        "--dataset",
        benchmark,
        "--n",
        "1",
        "--k",
        "1",
        "--temperature",
        "0",
        "--max-tokens",
        str(BENCHMARKS[benchmark]),
        "--no-progress",
        "--out",
        str(out),
    ]
    if limit:
        command += ["--limit", str(limit)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    samples = [json.loads(line) for line in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    return {
        "model": f"Qwen2.5-Coder-{model.upper()}-Instruct (Q4_K_M, dequantized)",
        "benchmark": benchmark,
        "published_pass@1": PUBLISHED.get((model, benchmark)),
        "pass@1": result["pass@1"],
        "stderr": result["stderr"]["pass@1"],
        "problems": result["n_problems"],
        "samples_per_problem": 1,
        "temperature": 0.0,
        "max_new_tokens": BENCHMARKS[benchmark],
        "seconds": round(seconds, 1),
        "statuses": dict(Counter(row["status"] for row in samples)),
        "command": " ".join(command[2:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["0.5b"], choices=["0.5b", "1.5b"])
    parser.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS), choices=list(BENCHMARKS))
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems of each set")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    rows = [
        run_row(model, benchmark, args.limit, args.out.parent / args.out.stem)
        for model in args.models
        for benchmark in args.benchmarks
    ]
    result = {"rows": rows} | provenance()
    write_result(args.out, result)
    for row in rows:
        published = "not found" if row["published_pass@1"] is None else f"{row['published_pass@1']:.3f}"
        append_line(
            f"{row['model']} {row['benchmark']} pass@1 greedy, {row['problems']} problems, "
            f"<= {row['max_new_tokens']} new tokens: **{row['pass@1']:.3f} +- {row['stderr']:.3f}** "
            f"(published {published}), {row['seconds']:.0f} s; statuses {row['statuses']}",
            result,
        )


if __name__ == "__main__":
    main()
