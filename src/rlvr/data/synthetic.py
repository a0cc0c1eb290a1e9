"""Synthetic arithmetic with verifiable answers: the demo's task, nothing downloaded.

Problems are drawn by seed, deduplicated, and split so that no test problem (as an
unordered pair of operands with its operation) appears in training.

Two tasks: `arithmetic_problems` (one operation on two operands; the demo's), and
`counting_problems`, whose worked solutions count up step by step, one step per unit of a
long-tailed step count, so that completions are long and uneven as reasoning traces are
(benchmarks/vs_trl.py --workload longtail).
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

from rlvr.records import Problem

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def question_text(a: int, op: str, b: int) -> str:
    return f"What is {a}{op}{b}? Answer in \\boxed{{}}."


_QUESTION = re.compile(r"What is (\d+)([-+*])(\d+)\?")
_COUNTING = re.compile(r"What is (\d+)\+(\d+)\*(\d+)\?")


def counting_question(start: int, step: int, count: int) -> str:
    return f"What is {start}+{step}*{count}? Answer in \\boxed{{}}."


def question_expression(question: str) -> str | None:
    """The arithmetic a question asks for ("What is 347*56? ..." -> "347*56"); None for other text."""
    head = question.split(" Answer")[0]
    match = _QUESTION.fullmatch(head) or _COUNTING.fullmatch(head)
    return head.removeprefix("What is ").removesuffix("?") if match else None


def solution_text(question: str, answer: str) -> str:
    """The completion the warm start teaches: a digit-by-digit working, then the boxed answer.

    Addition is worked column by column from the right, carrying, e.g. 47+85:
    `7+5=12,4+8+1=13. \\boxed{132}`; a tiny model learns the hundred one-digit sums and
    the carry far faster than the whole sum at once. Other operations get the answer alone.
    """
    counting = _COUNTING.fullmatch(question.split(" Answer")[0])
    if counting is not None:
        return _counting_solution(*(int(g) for g in counting.groups()))
    match = _QUESTION.fullmatch(question.split(" Answer")[0])
    if match is None or match.group(2) != "+":
        return f"\\boxed{{{answer}}}"
    a, b = match.group(1)[::-1], match.group(3)[::-1]
    steps, carry = [], 0
    for i in range(max(len(a), len(b))):
        x, y = int(a[i]) if i < len(a) else 0, int(b[i]) if i < len(b) else 0
        total = x + y + carry
        steps.append(f"{x}+{y}+{carry}={total}" if carry else f"{x}+{y}={total}")
        carry = total // 10
    return ",".join(steps) + f". \\boxed{{{answer}}}"


def _counting_solution(start: int, step: int, count: int) -> str:
    """s+a*b counted up from s in steps of a, each step numbered and written out, e.g. 23+7*3:
    `1:23+7=30,2:30+7=37,3:37+7=44. \\boxed{44}`. Each step copies the number just written and
    a, adds one digit to it, and increments the index; the count ends when the index reaches b."""
    steps = [f"{k}:{start + (k - 1) * step}+{step}={start + k * step}" for k in range(1, count + 1)]
    return ",".join(steps) + f". \\boxed{{{start + count * step}}}"


def counting_problems(
    *, seed: int, max_count: int, train_size: int, test_size: int, max_start: int = 99, steps: tuple[int, int] = (2, 9)
) -> tuple[list[Problem], list[Problem]]:
    """Distinct problems s+a*b (s in 0..max_start, a in `steps`, b in 1..max_count), split into
    (train, test) by seed. b is drawn log-uniformly, P(b) ~ 1/b: most worked solutions are
    short, a long tail counts to max_count (about 7.5 tokens a step with a character tokenizer)."""
    rng = random.Random(seed)
    pool_size = (max_start + 1) * (steps[1] - steps[0] + 1) * max_count
    wanted = train_size + test_size
    if wanted > pool_size // 2:
        raise ValueError(f"{wanted} problems asked from a pool of {pool_size}: raise max_count or ask for fewer")
    seen: set[tuple[int, int, int]] = set()
    problems: list[Problem] = []
    while len(problems) < wanted:
        s, a = rng.randint(0, max_start), rng.randint(*steps)
        b = min(max_count, int(math.exp(rng.uniform(0.0, math.log(max_count + 1)))))
        if (s, a, b) in seen:
            continue
        seen.add((s, a, b))
        problems.append(
            Problem(id=f"count-{len(problems)}", question=counting_question(s, a, b), answer=str(s + a * b))
        )
    return problems[:train_size], problems[train_size:]


def arithmetic_problems(
    *,
    seed: int,
    operations: list[str],
    min_digits: int,
    max_digits: int,
    train_size: int,
    test_size: int,
    second_operand_digits: int | None = None,
) -> tuple[list[Problem], list[Problem]]:
    """Draw distinct problems and split them into (train, test) by seed."""
    if min_digits > max_digits:
        raise ValueError(f"min_digits={min_digits} is larger than max_digits={max_digits}")
    rng = random.Random(seed)
    low, high = 10 ** (min_digits - 1) if min_digits > 1 else 0, 10**max_digits - 1
    second = second_operand_digits
    low_b, high_b = (low, high) if second is None else (10 ** (second - 1) if second > 1 else 0, 10**second - 1)
    pool_size = len(operations) * (high - low + 1) * (high_b - low_b + 1)
    wanted = train_size + test_size
    if wanted > pool_size // 2:
        raise ValueError(f"{wanted} problems asked from a pool of {pool_size}: widen the digits or ask for fewer")
    seen: set[tuple] = set()
    problems: list[Problem] = []
    while len(problems) < wanted:
        op = rng.choice(operations)
        a, b = rng.randint(low, high), rng.randint(low_b, high_b)
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
