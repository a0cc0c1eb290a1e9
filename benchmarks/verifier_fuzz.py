"""Fuzz the verifiers through the ScoringPool: no input may crash them or outlive its time limit.

Inputs start from real responses and answers (tests/data/verifier_cases.jsonl,
tests/data/peer_cases.jsonl, MATH-500 worked solutions) and go through one generator each:

- `grammar`: random LaTeX from a small grammar (numbers, fractions, roots, powers, intervals,
  sets, tuples, matrices, text, percents, relations, `\\pm`), boxed in a real response's words,
  against a mutation of itself or another expression;
- `nested_braces`: up to 20,000 levels, balanced or not, inside and around boxes;
- `huge_numbers`: integers and decimals of up to 100,000 digits, power towers, huge exponents
  and factorials, on either side;
- `lookalikes`: Unicode homoglyphs (Cyrillic letters, full-width digits, minus signs, fraction
  slashes), zero-width and direction marks, combining accents;
- `control`: control characters, NUL, lone surrogates, CR/LF runs;
- `truncated`: a real response cut at a random point, often inside its box;
- `megabyte`: ~1 MB responses (padding before the box, inside the box, a run of boxes, whitespace);
- `injection`: Python/sympy/shell/LaTeX (`\\input`, `\\write18`, self-expanding macros) injection
  strings and regex bombs (the `regex` verifier compiles the reference);
- `mutation`: random edits (deletions, duplications, stray braces, `$`, `\\boxed{`) of real text.

Rows use the built-in verifiers (mostly `math`, and `gsm8k`, `aime`, `exact`, `regex`) in a pool
with the default limits (RewardConfig: 2 workers, 2 s per item, 1024 MB), in steps of 256 items.
Recorded: statuses, crashes (an `error` status that is not a verifier's own verdict on a bad
reference: an exception, a memory-limit hit or a dead worker; must be 0), items that held their
worker longer than the timeout plus the 0.5 s kill grace (must be 0), worker restarts,
throughput, the slowest items, and whether an injection left a file behind. Item i is built from
`random.Random(f"{seed}:{i}")` alone: `--show I` prints it, so any failure is reproducible.

    flock /tmp/rlvr-heavy.lock python benchmarks/verifier_fuzz.py --out runs/verifier_fuzz.json

appends a line to docs/benchmarks.md (command, machine, date, figures).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

from _ledger import append_line, provenance, write_result

from rlvr.config import RewardConfig
from rlvr.data.datasets import builtin_path
from rlvr.rewards import ScoringPool, get_verifier

ROOT = Path(__file__).resolve().parents[1]
STEP = 256
MARKER = Path("/tmp/rlvr_fuzz_marker")
KINDS = {  # generator -> weight
    "grammar": 30,
    "mutation": 20,
    "nested_braces": 8,
    "huge_numbers": 10,
    "lookalikes": 8,
    "control": 8,
    "truncated": 8,
    "megabyte": 1,
    "injection": 7,
}
VERIFIER_WEIGHTS = {"math": 70, "gsm8k": 10, "aime": 10, "exact": 5, "regex": 5}
LOOKALIKES = {
    "0": "０",
    "1": "１",
    "2": "２",
    "5": "５",
    "-": "−",
    "x": "х",
    "a": "а",
    "e": "е",
    "o": "о",
    "p": "р",
    "c": "с",
    ",": "，",
    ".": "．",
    "/": "⁄",
    "(": "（",
    ")": "）",
    "{": "｛",
    "}": "｝",
    "\\": "＼",
    "=": "＝",
    "+": "＋",
    " ": "\u00a0",
    "%": "٪",
}
INVISIBLE = ["\u200b", "\u200d", "\u202e", "\u2066", "\ufeff", "\u0301", "\u00ad"]
CONTROL = ["\x00", "\x01", "\x07", "\x08", "\x1b", "\x7f", "\x85", "\r", "\r\n", "\u2028", "\ud800", "\x1b[31m"]
INJECTIONS = [
    f"__import__('os').system('touch {MARKER}')",
    f"eval(\"open('{MARKER}','w')\")",
    f"exec('import os; os.system(\"touch {MARKER}\")')",
    "().__class__.__bases__[0].__subclasses__()",
    "lambda: (yield)",
    "Symbol('x').__class__.__init__.__globals__",
    "\\input{/etc/passwd}",
    "\\include{/etc/shadow}",
    f"\\immediate\\write18{{touch {MARKER}}}",
    "\\def\\x{\\x\\x}\\x",
    "\\newcommand{\\a}{\\a}\\a",
    "${7*7}{{7*7}}",
    "'; DROP TABLE rewards; --",
    "%s%s%s%n",
    "../../../../etc/passwd",
    "\\catcode`\\{=12",
    "\\begin{verbatim}\\end{verbatim}",
    "\\verb|\\boxed{1}|",
]
REGEX_BOMBS = ["(a+)+$", "(a|aa)*b", "(x+x+)+y", "(\\d+)*\\.$", "((a*)*)*c", "[" * 50, "(?P<a>x)(?P=a" + ")" * 3]


def load_seeds() -> list[tuple[str, str]]:
    """(response, answer) pairs from rlvr's and peers' labelled sets and MATH-500 solutions;
    those whose answer is an integer come first, `integer_count` of them."""
    seeds = []
    for name in ("verifier_cases.jsonl", "peer_cases.jsonl"):
        for line in (ROOT / "tests" / "data" / name).open():
            case = json.loads(line)
            seeds.append((case["response"], case["answer"]))
    for line in builtin_path("math500").open():
        row = json.loads(line)
        seeds.append((row["solution"], row["answer"]))
    return sorted(seeds, key=lambda seed: not seed[1].strip().isdigit())


def integer_count(seeds: list[tuple[str, str]]) -> int:
    return sum(answer.strip().isdigit() for _, answer in seeds)


def latex(rng: random.Random, depth: int) -> str:
    """A random LaTeX-ish expression from a small grammar."""
    if depth <= 0 or rng.random() < 0.25:
        return rng.choice(
            [
                str(rng.randint(-1000, 10**6)),
                f"{rng.randint(0, 999)}.{rng.randint(0, 99999)}",
                f"{rng.randint(1, 999)},{rng.randint(0, 999):03d}",
                f"{rng.randint(1, 99)}, {rng.randint(0, 999)}",
                "\\pi",
                "x",
                "y",
                "e",
                "\\infty",
                "i",
                "\\sqrt{2}",
                f"\\text{{{rng.choice(['cm', 'percent', 'and', 'or', 'Evelyn', 'odd'])}}}",
            ]
        )
    a, b = latex(rng, depth - 1), latex(rng, depth - 1)
    return rng.choice(
        [
            f"\\frac{{{a}}}{{{b}}}",
            f"\\dfrac{a[:1]}{b[:1]}",
            f"\\sqrt{{{a}}}",
            f"\\sqrt[3]{{{a}}}",
            f"{a}^{{{b}}}",
            f"{a}+{b}",
            f"{a}-{b}",
            f"{a}\\cdot {b}",
            f"({a})",
            f"\\left({a}\\right)",
            f"({a}, {b}]",
            f"[{a},{b})",
            f"\\{{{a}, {b}\\}}",
            f"({a},{b})",
            f"{a} \\cup {b}",
            f"\\begin{{pmatrix}}{a} & {b} \\\\ {b} & {a}\\end{{pmatrix}}",
            f"{a}\\%",
            f"{a} \\le x < {b}",
            f"x \\ge {a}",
            f"{a} \\pm {b}",
            f"\\sin({a})",
            f"\\log_{{{a}}} {b}",
            f"{a}!",
            f"\\binom{{{a}}}{{{b}}}",
            f"{a}_{{{b}}}",
            f"{a}, {b}",
            f"{a} \\text{{ or }} {b}",
            f"x = {a}",
            f"{a}^\\circ",
            f"\\${a}",
            f"{a} {rng.randint(1, 9)}/{rng.randint(2, 9)}",
            f"{{{a}}}",
        ]
    )


def mutate(rng: random.Random, text: str, edits: int = 3) -> str:
    tokens = [
        "{",
        "}",
        "\\",
        "$",
        "\\boxed{",
        ",",
        " ",
        "\\frac",
        "^",
        "_",
        "%",
        "\\{",
        "\\}",
        "(",
        "]",
        "0",
        "\n",
        "\\left",
        "=",
        "</think>",
    ]
    for _ in range(edits):
        if not text:
            text = rng.choice(tokens)
            continue
        i = rng.randrange(len(text))
        j = min(len(text), i + rng.randint(1, 20))
        op = rng.randrange(4)
        if op == 0:
            text = text[:i] + text[j:]
        elif op == 1:
            text = text[:j] + text[i:j] + text[j:]
        elif op == 2:
            text = text[:i] + rng.choice(tokens) + text[i:]
        else:
            text = text[:i] + text[i:j][::-1] + text[j:]
    return text


def make_item(seed: int, index: int, seeds: list[tuple[str, str]]) -> dict:
    """Item `index` of the run: built from its own generator, so it can be rebuilt alone."""
    rng = random.Random(f"{seed}:{index}")
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    verifier = rng.choices(list(VERIFIER_WEIGHTS), weights=list(VERIFIER_WEIGHTS.values()))[0]
    # aime and gsm8k call a non-number reference bad: mostly give them integer references
    integers = integer_count(seeds) if verifier in ("aime", "gsm8k") and rng.random() < 0.8 else len(seeds)
    response, answer = seeds[rng.randrange(integers)]
    words = response[: rng.randint(0, 300)]
    if kind == "grammar":
        expression = latex(rng, rng.choice([2, 3, 4, 4, 6, 12]))
        response = f"{words}\nSo the answer is $\\boxed{{{expression}}}$."
        answer = mutate(rng, expression, rng.randint(0, 2)) if rng.random() < 0.5 else latex(rng, 3)
    elif kind == "mutation":
        response, answer = mutate(rng, response, rng.randint(1, 12)), mutate(rng, answer, rng.randint(0, 3))
    elif kind == "nested_braces":
        depth = rng.choice([10, 100, 1000, 5000, 20000])
        core = rng.choice([answer, "1", "\\frac{1}{2}", ""])
        opened, closed = "{" * depth, "}" * rng.choice([depth, depth // 2, 0, depth + 3])
        response = rng.choice(
            [f"\\boxed{{{opened}{core}{closed}}}", f"{opened}\\boxed{{{core}}}{closed}", f"\\boxed{{{opened}"]
        )
        answer = rng.choice([answer, opened + core + closed])
    elif kind == "huge_numbers":
        digits = rng.choice([20, 400, 5000, 100_000])
        big = str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(digits))
        pick = rng.choice(
            [
                big,
                f"{big}.{big[: digits // 2]}",
                f"10^{{10^{{10^{{{big[:3]}}}}}}}",
                f"2^{{{big[:9]}}}",
                f"{big[:7]}!",
                f"1e{big[:6]}",
                f"\\frac{{10^{{{big[:5]}}}}}{{3}}",
                f"{big[:12]}^{{{big[:12]}}}",
                f"({big[:50]})^{{{big[:4]}}} - 1",
                f"{big[:3]},{big[3:6]},{big[6:9]}" * 100,
                f"-{big}\\%",
            ]
        )
        response = f"{words} \\boxed{{{pick}}}"
        answer = rng.choice([answer, pick, big[: rng.randint(1, 30)]])
    elif kind == "lookalikes":
        table = {k: v for k, v in LOOKALIKES.items() if rng.random() < 0.5}
        response = "".join(table.get(ch, ch) for ch in response)
        answer = "".join(table.get(ch, ch) for ch in answer)
        for _ in range(rng.randint(1, 5)):
            i = rng.randrange(len(response) + 1)
            response = response[:i] + rng.choice(INVISIBLE) + response[i:]
    elif kind == "control":
        for _ in range(rng.randint(1, 10)):
            i = rng.randrange(len(response) + 1)
            response = response[:i] + rng.choice(CONTROL) * rng.choice([1, 1, 3, 1000]) + response[i:]
        if rng.random() < 0.3:
            answer = answer + rng.choice(CONTROL)
    elif kind == "truncated":
        at = response.rfind("\\boxed")
        cut = (
            rng.randint(max(0, at), len(response)) if at >= 0 and rng.random() < 0.7 else rng.randint(0, len(response))
        )
        response = response[:cut]
    elif kind == "megabyte":
        size = 1_000_000
        filler = (words or "Let us think step by step. ") * (size // max(1, len(words or "x" * 27)) + 1)
        response = rng.choice(
            [
                filler[:size] + f"\\boxed{{{answer}}}",
                f"\\boxed{{{filler[:size]}}}",
                "\\boxed{1}" * (size // 9),
                " " * size + f"\\boxed{{{answer}}}",
                f"\\boxed{{{answer}}}" + "\n" * size,
                "$" * size,
                "{" * (size // 2) + "\\boxed{1}",
            ]
        )
    else:  # injection
        payload = rng.choice(INJECTIONS)
        response = f"{words} \\boxed{{{payload}}}" if rng.random() < 0.7 else payload
        answer = rng.choice([answer, payload])
        if verifier == "regex" or rng.random() < 0.1:
            verifier = "regex"
            answer = rng.choice(REGEX_BOMBS)
            response = f"\\boxed{{{'a' * rng.randint(20, 40)}{rng.choice(['!', 'x', '1'])}}}"
    return {"index": index, "kind": kind, "verifier": verifier, "response": response, "answer": answer}


class _ReplayTimeout(BaseException):
    pass


def _raise_replay_timeout(signum, frame):
    raise _ReplayTimeout


def classify_error(item: dict, timeout_s: float) -> str | None:
    """None when an `error` status is the verifier's own verdict (a bad reference); else what broke."""
    signal.signal(signal.SIGALRM, _raise_replay_timeout)
    signal.setitimer(signal.ITIMER_REAL, timeout_s * 2)
    try:
        score = get_verifier(item["verifier"])(item["response"], item["answer"])
    except _ReplayTimeout:
        return "error in the pool, slow in the replay"
    except Exception as e:  # the crash itself, to report
        return f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return (
        None
        if score.status == "error"
        else f"error in the pool (memory limit or dead worker); replay gives {score.status}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where to write the JSON result")
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, help="print item SHOW of this seed and exit")
    args = parser.parse_args()
    seeds = load_seeds()
    if args.show is not None:
        print(json.dumps(make_item(args.seed, args.show, seeds), ensure_ascii=True, indent=2))
        return
    if args.out is None:
        parser.error("--out is required")

    limits = RewardConfig()
    MARKER.unlink(missing_ok=True)
    items = [make_item(args.seed, i, seeds) for i in range(args.items)]
    scores, seconds = [], []
    started = time.perf_counter()
    with ScoringPool(
        "math", workers=limits.workers, timeout_s=limits.timeout_s, memory_limit_mb=limits.memory_limit_mb
    ) as pool:
        pool.wait_ready()
        startup_s = time.perf_counter() - started
        t0 = time.perf_counter()
        for i in range(0, len(items), STEP):
            batch = items[i : i + STEP]
            scores += pool.score(
                [x["response"] for x in batch], [x["answer"] for x in batch], [x["verifier"] for x in batch]
            )
            seconds += pool.item_seconds
        wall_s = time.perf_counter() - t0
        restarts = pool.restarts

    deadline = limits.timeout_s + 0.5
    crashes = []
    for item, score in zip(items, scores):
        if score.status == "error" and (what := classify_error(item, limits.timeout_s)) is not None:
            crashes.append({"index": item["index"], "kind": item["kind"], "verifier": item["verifier"], "what": what})
    by_kind: dict[str, dict] = defaultdict(lambda: {"items": 0, "statuses": Counter(), "max_s": 0.0})
    for item, score, s in zip(items, scores, seconds):
        row = by_kind[item["kind"]]
        row["items"] += 1
        row["statuses"][score.status] += 1
        row["max_s"] = round(max(row["max_s"], s), 3)
    slowest = sorted(range(len(items)), key=lambda i: -seconds[i])[:10]
    result = {
        "items": len(items),
        "seed": args.seed,
        "limits": {"workers": limits.workers, "timeout_s": limits.timeout_s, "memory_limit_mb": limits.memory_limit_mb},
        "crashes": len(crashes),
        "crash_items": crashes,
        "past_deadline": sum(s > deadline for s in seconds),
        "deadline_s": deadline,
        "max_item_s": round(max(seconds), 3),
        "statuses": dict(Counter(s.status for s in scores)),
        "worker_restarts": restarts,
        "items_per_s": round(len(items) / wall_s, 1),
        "wall_s": round(wall_s, 1),
        "startup_s": round(startup_s, 2),
        "side_effects": MARKER.exists(),
        "by_kind": {k: {**v, "statuses": dict(v["statuses"])} for k, v in sorted(by_kind.items())},
        "slowest": [
            {
                "index": i,
                "kind": items[i]["kind"],
                "verifier": items[i]["verifier"],
                "seconds": round(seconds[i], 3),
                "status": scores[i].status,
                "response_chars": len(items[i]["response"]),
            }
            for i in slowest
        ],
    } | provenance()
    write_result(args.out, result)
    append_line(
        f"verifier fuzz ({result['items']} generated items, seed {args.seed}, pool with the default limits: "
        f"{limits.workers} workers, {limits.timeout_s} s, {limits.memory_limit_mb} MB): **{result['crashes']} crashes, "
        f"{result['past_deadline']} items past {deadline} s** (slowest {result['max_item_s']} s), "
        f"{restarts} worker restarts, {result['items_per_s']} items/s, statuses {result['statuses']}, "
        f"injection side effects: {'yes' if result['side_effects'] else 'none'}",
        result,
    )


if __name__ == "__main__":
    main()
