"""Accuracy of rlvr's verifiers on the labelled set, next to math-verify used alone.

Reads tests/data/verifier_cases.jsonl (response, answer, verifier, expected reward), scores
every case through a ScoringPool twice: with rlvr's verifier for the case, and with plain
math-verify (`verify(parse(answer), parse(response))`, its default extraction). Both run
sandboxed, since math-verify alone hangs on some adversarial inputs. Prints accuracy by
category as a Markdown table, then every case where the two disagree on correctness.

    python benchmarks/verifier_accuracy.py
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from rlvr.rewards import ScoringPool

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "data" / "verifier_cases.jsonl"


def math_verify_alone(response: str, answer: str) -> float:
    """math-verify as most RL code calls it: default extraction on both sides."""
    from math_verify import parse, verify

    reference = answer.rsplit("####", 1)[-1].strip()
    return float(verify(parse("$" + reference + "$"), parse(response)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()

    cases = [json.loads(line) for line in args.cases.open()]
    responses, answers = [c["response"] for c in cases], [c["answer"] for c in cases]
    with ScoringPool("math", timeout_s=args.timeout_s) as pool:
        ours = pool.score(responses, answers, [c["verifier"] for c in cases])
        alone = pool.score(responses, answers, [f"{Path(__file__).resolve()}:math_verify_alone"] * len(cases))

    by_category: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    differences = []
    for case, mine, theirs in zip(cases, ours, alone):
        row = by_category[case["category"]]
        mine_right = mine.reward == case["expected"]
        theirs_right = theirs.reward == case["expected"]
        row[0] += 1
        row[1] += mine_right
        row[2] += theirs_right
        if mine_right != theirs_right:
            differences.append((case, mine, theirs))

    total = [sum(r[i] for r in by_category.values()) for i in range(3)]
    print("| category | cases | rlvr correct | math-verify alone correct |")
    print("|---|---|---|---|")
    for category, (n, mine, theirs) in sorted(by_category.items()):
        print(f"| {category} | {n} | {mine} | {theirs} |")
    print(f"| **all** | {total[0]} | **{total[1]} ({total[1] / total[0]:.1%})** | {total[2]} ({total[2] / total[0]:.1%}) |")
    print(f"\nCases where rlvr and math-verify alone differ ({len(differences)}):\n")
    print("| id | answer | response ends with | expected | rlvr | math-verify alone |")
    print("|---|---|---|---|---|---|")
    for case, mine, theirs in differences:
        tail = case["response"][-60:].replace("\n", " ").replace("|", "\\|")
        answer = case["answer"].replace("|", "\\|")
        print(
            f"| {case['id']} | `{answer}` | `{tail}` | {case['expected']} | "
            f"{mine.reward:g} ({mine.status}) | {theirs.reward:g} ({theirs.status}) |"
        )


if __name__ == "__main__":
    main()
