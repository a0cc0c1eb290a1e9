"""Accuracy of rlvr's verifiers on a labelled set, next to math-verify used alone.

Two sets, one table shape:

- tests/data/verifier_cases.jsonl (default): rlvr's own cases (response, answer, verifier,
  expected). Prints accuracy by category, then every case where the two disagree.
- tests/data/peer_cases.jsonl (`--cases`): cases from peers' test suites (source, category,
  boxed, judgment). Prints accuracy by source and by category on the boxed cases (all of them,
  and those whose expectation is not a judgment call), then the free-text cases (no box), which
  rlvr reads with `extract=boxed,answer,last_number`, then the boxed cases where the two differ.

Every case goes through a ScoringPool twice: with rlvr's verifier and with plain math-verify
(`verify(parse(answer), parse(response))`, its default extraction). Both run sandboxed, since
math-verify alone hangs on some adversarial inputs.

    python benchmarks/verifier_accuracy.py [--cases tests/data/peer_cases.jsonl]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from rlvr.rewards import ScoringPool

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "data" / "verifier_cases.jsonl"
FREE_TEXT_OPTIONS = {"extract": ["boxed", "answer", "last_number"]}


def math_verify_alone(response: str, answer: str) -> float:
    """math-verify as most RL code calls it: default extraction on both sides."""
    from math_verify import parse, verify

    reference = answer.rsplit("####", 1)[-1].strip()
    return float(verify(parse("$" + reference + "$"), parse(response)))


def score_both(cases: list[dict], timeout_s: float) -> tuple[list, list]:
    """(rlvr's scores, math-verify's scores), one per case, in order."""
    alone = f"{Path(__file__).resolve()}:math_verify_alone"
    ours: list = [None] * len(cases)
    for options, picked in (
        (None, [c for c in cases if c.get("boxed", True)]),
        (FREE_TEXT_OPTIONS, [c for c in cases if not c.get("boxed", True)]),
    ):
        if not picked:
            continue
        index = [cases.index(c) for c in picked]
        with ScoringPool("math", timeout_s=timeout_s, options=options) as pool:
            for i, s in zip(
                index,
                pool.score(
                    [c["response"] for c in picked],
                    [c["answer"] for c in picked],
                    [c.get("verifier", "math") for c in picked],
                ),
            ):
                ours[i] = s
    with ScoringPool("math", timeout_s=timeout_s) as pool:
        theirs = pool.score([c["response"] for c in cases], [c["answer"] for c in cases], [alone] * len(cases))
    return ours, theirs


def print_table(title: str, cases: list[dict], ours: list, theirs: list, key: str, split_judgment: bool) -> None:
    rows: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
    for case, mine, other in zip(cases, ours, theirs):
        plain = not case.get("judgment")
        for name in (case[key], "**all**"):
            row = rows[name]
            row[0] += 1
            row[1] += mine.reward == case["expected"]
            row[2] += other.reward == case["expected"]
            row[3] += plain
            row[4] += plain and mine.reward == case["expected"]
            row[5] += plain and other.reward == case["expected"]
    print(f"\n{title}\n")
    if split_judgment:
        print(
            "| "
            + key
            + " | cases | rlvr correct | math-verify alone correct | not judgment calls | rlvr correct | math-verify alone correct |"
        )
        print("|---|---|---|---|---|---|---|")
    else:
        print(f"| {key} | cases | rlvr correct | math-verify alone correct |")
        print("|---|---|---|---|")
    for name in sorted(rows, key=lambda n: (n == "**all**", n)):
        n, mine, other, m, mine_plain, other_plain = rows[name]
        cells = [name, n, f"{mine} ({mine / n:.1%})", f"{other} ({other / n:.1%})"]
        if split_judgment:
            cells += [
                m,
                f"{mine_plain} ({mine_plain / max(m, 1):.1%})",
                f"{other_plain} ({other_plain / max(m, 1):.1%})",
            ]
        print("| " + " | ".join(map(str, cells)) + " |")


def print_differences(cases: list[dict], ours: list, theirs: list) -> None:
    differences = [
        (c, m, t) for c, m, t in zip(cases, ours, theirs) if (m.reward == c["expected"]) != (t.reward == c["expected"])
    ]
    print(f"\nCases where rlvr and math-verify alone differ ({len(differences)}):\n")
    print("| id | answer | response ends with | expected | judgment | rlvr | math-verify alone |")
    print("|---|---|---|---|---|---|---|")
    for case, mine, theirs_ in differences:
        tail = case["response"][-60:].replace("\n", " ").replace("|", "\\|")
        answer = case["answer"][-60:].replace("\n", " ").replace("|", "\\|")
        print(
            f"| {case['id']} | `{answer}` | `{tail}` | {case['expected']} | {case.get('judgment') or ''} | "
            f"{mine.reward:g} ({mine.status}) | {theirs_.reward:g} ({theirs_.status}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()

    cases = [json.loads(line) for line in args.cases.open()]
    ours, theirs = score_both(cases, args.timeout_s)
    if "source" not in cases[0]:
        print_table("All cases", cases, ours, theirs, "category", split_judgment=False)
        print_differences(cases, ours, theirs)
        return
    boxed = [i for i, c in enumerate(cases) if c["boxed"]]
    free = [i for i, c in enumerate(cases) if not c["boxed"]]
    for title, key in (("Boxed cases by source", "source"), ("Boxed cases by category", "category")):
        print_table(
            title,
            [cases[i] for i in boxed],
            [ours[i] for i in boxed],
            [theirs[i] for i in boxed],
            key,
            split_judgment=True,
        )
    print_table(
        "Free-text cases (no box) by source; rlvr with extract=boxed,answer,last_number",
        [cases[i] for i in free],
        [ours[i] for i in free],
        [theirs[i] for i in free],
        "source",
        split_judgment=False,
    )
    print_differences([cases[i] for i in boxed], [ours[i] for i in boxed], [theirs[i] for i in boxed])


if __name__ == "__main__":
    main()
