"""Synthetic arithmetic with verifiable answers: the demo's task, nothing downloaded.

Problems are drawn by seed, deduplicated, and split so that no test problem (as an
unordered pair of operands with its operation) appears in training.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from rlvr.records import Problem

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def question_text(a: int, op: str, b: int) -> str:
    return f"What is {a}{op}{b}? Answer in \\boxed{{}}."


def solution_text(answer: str) -> str:
    """The completion the warm start teaches: the final answer, boxed."""
    return f"\\boxed{{{answer}}}"


def arithmetic_problems(
    *,
    seed: int,
    operations: list[str],
    min_digits: int,
    max_digits: int,
    train_size: int,
    test_size: int,
) -> tuple[list[Problem], list[Problem]]:
    """Draw distinct problems and split them into (train, test) by seed."""
    if min_digits > max_digits:
        raise ValueError(f"min_digits={min_digits} is larger than max_digits={max_digits}")
    rng = random.Random(seed)
    low, high = 10 ** (min_digits - 1) if min_digits > 1 else 0, 10**max_digits - 1
    pool_size = len(operations) * (high - low + 1) ** 2
    wanted = train_size + test_size
    if wanted > pool_size // 2:
        raise ValueError(f"{wanted} problems asked from a pool of {pool_size}: widen the digits or ask for fewer")
    seen: set[tuple] = set()
    problems: list[Problem] = []
    while len(problems) < wanted:
        op = rng.choice(operations)
        a, b = rng.randint(low, high), rng.randint(low, high)
        key = (op, min(a, b), max(a, b)) if op in "+*" else (op, a, b)
        if key in seen:
            continue
        seen.add(key)
        answer = str(_APPLY[op](a, b))
        problems.append(Problem(id=f"arith-{len(problems)}", question=question_text(a, op, b), answer=answer))
    return problems[:train_size], problems[train_size:]


def write_jsonl(problems: list[Problem], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for p in problems:
            f.write(json.dumps({"id": p.id, "problem": p.question, "answer": p.answer}) + "\n")
    tmp.replace(path)
    return path
