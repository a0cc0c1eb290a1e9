"""The verifier registry: `get_verifier(name, **options)` -> `(response, reference) -> Score`.

Verifiers are pure and in-process; the scoring pool (`pool.py`) adds timeouts and isolation.
Every verifier reads only the text after `reasoning_end` (default "</think>"; a response whose
`<think>` never closes has no answer; "" reads everything), with the extraction modes in
`extract`, tried in order until one finds something: "boxed" (the last `\\boxed{}`), "answer"
(`Answer: ...`), "last_number", "whole" (the whole response, stripped). No answer -> status
"no_answer".

- `math`: `equivalence.equivalent`. Hedges score 0 (`hedging.py`): several boxed answers that
  are not all equivalent, or a list of candidates for a single-valued reference. For a
  multi-valued reference (`3, 5`), distinct boxes are joined with ", " and compared as one
  answer; more than `MAX_DISTINCT_ANSWERS` different boxes are a hedge. A final answer or
  reference over `MAX_ANSWER_CHARS` characters is compared as a plain string. A reference
  holding boxes is reduced to them (`extract.reference_answer`). Options: `extract` (default
  ("boxed",)), `reasoning_end`, `ignore_case`, `percent`, `decimal_comma` (`equivalence.Rules`).
- `aime` (extract=("boxed",)): the answer must be an integer literal 0-999 (after
  normalisation, so `\\boxed{025}` and `$25$` count); compared as integers with the reference.
- `gsm8k`: the number after `####`, else the last box, else the last number; commas, `$` and
  a trailing `.` ignored; compared as exact numbers. A reference holding `####` (a dataset
  solution) is reduced to the number after it.
- `exact` (extract=("boxed",), ignore_case=False): stripped strings equal.
- `regex` (extract=("boxed",), ignore_case=False): the reference is a regular expression the
  final answer must match in full.
- `code`: the response's last python block run against test code in the sandbox
  (`code_tests.py`; options: `fraction` and SandboxConfig's fields).
- `reasoning_gym`: the referenced reasoning-gym task's own scorer (`reasoning_gym.py`).
- `module:function` or `file.py:function`: a custom reward (`custom.py`).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence

from rlvr.records import Score
from rlvr.rewards.custom import load_custom
from rlvr.rewards.equivalence import DEFAULT_RULES, Rules, equivalent, normalize, numeric_values
from rlvr.rewards.extract import (
    after_hashes,
    after_reasoning,
    answer_line,
    boxed_answers,
    last_number,
    reference_answer,
)
from rlvr.rewards.hedging import hedges, is_scalar
from rlvr.rewards.reasoning_gym import reasoning_gym_verifier

Verifier = Callable[[str, str], Score]
MAX_ANSWER_CHARS = 10_000  # longer final answers (or references) are compared as plain strings
MAX_DISTINCT_ANSWERS = 64  # more different boxes than this are a hedge, whatever the reference

_EXTRACTORS: dict[str, Callable[[str], list[str]]] = {
    "boxed": boxed_answers,
    "answer": lambda text: [a] if (a := answer_line(text)) else [],
    "last_number": lambda text: [n] if (n := last_number(text)) else [],
    "whole": lambda text: [text.strip()] if text.strip() else [],
}


def _check_reasoning_end(marker: object) -> None:
    if not isinstance(marker, str):
        raise ValueError(f"option reasoning_end={marker!r}: expected a string ('' reads the whole response)")


def _reader(extract: Sequence[str] | str, reasoning_end: str) -> Callable[[str], list[str]]:
    """`response -> candidates`: the text after `reasoning_end` (`extract.after_reasoning`), read
    by the first extraction mode that finds something (several candidates only for boxes)."""
    modes = tuple(m.strip() for m in extract.split(",")) if isinstance(extract, str) else tuple(extract)
    unknown = [m for m in modes if m not in _EXTRACTORS]
    if unknown or not modes:
        raise ValueError(
            f"option extract: unknown mode(s) {unknown or list(modes)}; choose from {', '.join(_EXTRACTORS)}"
        )
    _check_reasoning_end(reasoning_end)

    def candidates(response: str) -> list[str]:
        text = after_reasoning(response, reasoning_end)
        for mode in modes if text is not None else ():
            if found := _EXTRACTORS[mode](text):
                return found
        return []

    return candidates


def _final_answer(candidates: list[str], reference: str, rules: Rules = DEFAULT_RULES) -> tuple[str, bool]:
    """(the final answer, whether the boxes disagree) following the module-doc rules."""
    final = candidates[-1]
    spellings = list(dict.fromkeys(candidates))
    if len(spellings) == 1:
        return final, False
    if len(spellings) > MAX_DISTINCT_ANSWERS:
        return final, True
    distinct = list(dict.fromkeys(normalize(c, rules) for c in spellings))
    if len(distinct) == 1:
        return final, False
    if not is_scalar(reference, rules):
        return ", ".join(distinct), False
    return final, not all(equivalent(c, final, rules) for c in distinct)


def math_verifier(
    *,
    extract: Sequence[str] = ("boxed",),
    reasoning_end: str = "</think>",
    ignore_case: bool = True,
    percent: str = "either",
    decimal_comma: str = "auto",
) -> Verifier:
    read = _reader(extract, reasoning_end)
    rules = Rules(percent=percent, decimal_comma=decimal_comma, ignore_case=ignore_case)

    def score(response: str, reference: str) -> Score:
        candidates = read(response)
        if not candidates:
            return Score(0.0, "no_answer", None)
        reference = reference_answer(reference)
        final, disagree = _final_answer(candidates, reference, rules)
        if max(len(final), len(reference)) > MAX_ANSWER_CHARS:
            return Score(float(not disagree and final.strip() == reference.strip()), "ok", final)
        if disagree or hedges(final, reference, rules):
            return Score(0.0, "ok", final)
        return Score(float(equivalent(final, reference, rules)), "ok", final)

    return score


def _small_integer(text: str) -> int | None:
    """The value of an integer literal with at most 9 significant digits, else None (int() of
    4300+ digits raises, and an AIME answer has 3)."""
    return int(text) if text.isdigit() and text.isascii() and len(text.lstrip("0")) <= 9 else None


def aime_verifier(*, extract: Sequence[str] = ("boxed",), reasoning_end: str = "</think>") -> Verifier:
    read = _reader(extract, reasoning_end)

    def score(response: str, reference: str) -> Score:
        ref = _small_integer(normalize(reference_answer(reference)))
        if ref is None:
            return Score(0.0, "error", None)
        candidates = read(response)
        if not candidates:
            return Score(0.0, "no_answer", None)
        final, disagree = _final_answer(candidates, str(ref))
        answer = _small_integer(normalize(final)) if len(final) <= MAX_ANSWER_CHARS else None
        valid = answer is not None and answer <= 999
        return Score(float(valid and not disagree and answer == ref), "ok", final)

    return score


def _gsm8k_number(text: str) -> frozenset | None:
    return numeric_values(text.replace(",", "").replace("$", "").strip().removesuffix("."))


def gsm8k_verifier(*, reasoning_end: str = "</think>") -> Verifier:
    _check_reasoning_end(reasoning_end)

    def score(response: str, reference: str) -> Score:
        ref = _gsm8k_number(after_hashes(reference) or reference)
        if ref is None:
            return Score(0.0, "error", None)
        response = after_reasoning(response, reasoning_end)
        if response is None:
            return Score(0.0, "no_answer", None)
        marked = after_hashes(response)
        boxes = [] if marked else boxed_answers(response)
        final = marked or (boxes[-1] if boxes else None) or last_number(response)
        if final is None:
            return Score(0.0, "no_answer", None)
        spellings = set(boxes)
        if len(spellings) > MAX_DISTINCT_ANSWERS or len({normalize(b) for b in spellings}) > 1:
            return Score(0.0, "ok", final)
        value = _gsm8k_number(final)
        return Score(float(value is not None and not value.isdisjoint(ref)), "ok", final)

    return score


def exact_verifier(
    *, extract: Sequence[str] = ("boxed",), ignore_case: bool = False, reasoning_end: str = "</think>"
) -> Verifier:
    read = _reader(extract, reasoning_end)

    def score(response: str, reference: str) -> Score:
        candidates = read(response)
        if not candidates:
            return Score(0.0, "no_answer", None)
        final, ref = candidates[-1].strip(), reference.strip()
        if ignore_case:
            return Score(float(final.casefold() == ref.casefold()), "ok", final)
        return Score(float(final == ref), "ok", final)

    return score


def regex_verifier(
    *, extract: Sequence[str] = ("boxed",), ignore_case: bool = False, reasoning_end: str = "</think>"
) -> Verifier:
    read = _reader(extract, reasoning_end)
    flags = re.IGNORECASE if ignore_case else 0

    def score(response: str, reference: str) -> Score:
        try:
            pattern = re.compile(reference.strip(), flags)
        except (re.error, OverflowError, RecursionError):  # not a usable pattern: a bad reference
            return Score(0.0, "error", None)
        candidates = read(response)
        if not candidates:
            return Score(0.0, "no_answer", None)
        final = candidates[-1].strip()
        return Score(float(pattern.fullmatch(final) is not None), "ok", final)

    return score


def code_verifier(**options) -> Verifier:
    from rlvr.rewards.code_tests import code_verifier  # the sandbox is imported only where code is scored

    return code_verifier(**options)


VERIFIERS: dict[str, Callable[..., Verifier]] = {
    "math": math_verifier,
    "aime": aime_verifier,
    "gsm8k": gsm8k_verifier,
    "exact": exact_verifier,
    "regex": regex_verifier,
    "code": code_verifier,
    "reasoning_gym": reasoning_gym_verifier,  # reasoning-gym's own scorers (reasoning_gym.py)
}


def get_verifier(name: str, **options) -> Verifier:
    """The verifier called `name` (a built-in or `module:function`), configured by `options`.

    Unknown option names and bad values raise ValueError naming the option."""
    if name in VERIFIERS:
        factory = VERIFIERS[name]
        parameters = inspect.signature(factory).parameters
        named = [p.name for p in parameters.values() if p.kind is not p.VAR_KEYWORD]
        takes_any = any(
            p.kind is p.VAR_KEYWORD for p in parameters.values()
        )  # it checks its own (code: SandboxConfig's)
        for key in options:
            if key not in named and not takes_any:
                raise ValueError(f"verifier {name!r}: unknown option {key!r}; options: {', '.join(named) or 'none'}")
        return factory(**options)
    if ":" in name:
        return load_custom(name, **options)
    raise ValueError(f"unknown verifier {name!r}; choose from {sorted(VERIFIERS)} or 'module:function'")


def parse_option(text: str) -> tuple[str, object]:
    """`key=value` from a command line as (key, value): `true`/`false` become bools, numbers
    numbers, and a value with commas a list (`extract=boxed,answer` -> ["boxed", "answer"])."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"option {text!r}: expected key=value")
    key, value = key.strip(), value.strip()
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    if "," in value:
        return key, [v.strip() for v in value.split(",") if v.strip()]
    for number in (int, float):
        try:
            return key, number(value)
        except ValueError:
            pass
    return key, value
