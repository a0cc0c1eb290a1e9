"""The verifier registry: `get_verifier(name, **options)` -> `(response, reference) -> Score`.

Verifiers are pure and in-process; the scoring pool (`pool.py`) adds timeouts and isolation.
Every verifier reads the final answer with the extraction modes in `extract`, tried in order
until one finds something: "boxed" (the last `\\boxed{}`), "answer" (`Answer: ...`),
"last_number", "whole" (the whole response, stripped). No answer -> status "no_answer".

- `math` (extract=("boxed",)): `equivalence.equivalent`. Hedges score 0 (`hedging.py`):
  several boxed answers that are not all equivalent, or a list of candidates for a
  single-valued reference. For a multi-valued reference (`3, 5`), distinct boxes are joined
  with ", " and compared as one answer.
- `aime` (extract=("boxed",)): the answer must be an integer literal 0-999 (after
  normalisation, so `\\boxed{025}` and `$25$` count); compared as integers with the reference.
- `gsm8k`: the number after `####`, else the last box, else the last number; commas, `$` and
  a trailing `.` ignored; compared as exact numbers. A reference holding `####` (a dataset
  solution) is reduced to the number after it.
- `exact` (extract=("boxed",), ignore_case=False): stripped strings equal.
- `regex` (extract=("boxed",), ignore_case=False): the reference is a regular expression the
  final answer must match in full.
- `reasoning_gym`: the referenced reasoning-gym task's own scorer (`reasoning_gym.py`).
- `module:function` or `file.py:function`: a custom reward (`custom.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from rlvr.records import Score
from rlvr.rewards.custom import load_custom
from rlvr.rewards.equivalence import equivalent, normalize, numeric_values
from rlvr.rewards.extract import after_hashes, answer_line, boxed_answers, last_number
from rlvr.rewards.hedging import hedges, is_scalar
from rlvr.rewards.reasoning_gym import reasoning_gym_verifier

Verifier = Callable[[str, str], Score]

_EXTRACTORS: dict[str, Callable[[str], list[str]]] = {
    "boxed": boxed_answers,
    "answer": lambda text: [a] if (a := answer_line(text)) else [],
    "last_number": lambda text: [n] if (n := last_number(text)) else [],
    "whole": lambda text: [text.strip()] if text.strip() else [],
}


def _check_modes(extract: Sequence[str]) -> tuple[str, ...]:
    modes = (extract,) if isinstance(extract, str) else tuple(extract)
    unknown = [m for m in modes if m not in _EXTRACTORS]
    if unknown or not modes:
        raise ValueError(f"unknown extract mode(s) {unknown or modes!r}; choose from {sorted(_EXTRACTORS)}")
    return modes


def _candidates(response: str, modes: tuple[str, ...]) -> list[str]:
    """The answers the first successful extraction mode finds (several only for boxes)."""
    for mode in modes:
        found = _EXTRACTORS[mode](response)
        if found:
            return found
    return []


def _final_answer(candidates: list[str], reference: str) -> tuple[str, bool]:
    """(the final answer, whether the boxes disagree) following the module-doc rules."""
    final = candidates[-1]
    distinct = list(dict.fromkeys(normalize(c) for c in candidates))
    if len(distinct) == 1:
        return final, False
    if not is_scalar(reference):
        return ", ".join(distinct), False
    return final, not all(equivalent(c, final) for c in distinct)


def math_verifier(*, extract: Sequence[str] = ("boxed",)) -> Verifier:
    modes = _check_modes(extract)

    def score(response: str, reference: str) -> Score:
        candidates = _candidates(response, modes)
        if not candidates:
            return Score(0.0, "no_answer", None)
        final, disagree = _final_answer(candidates, reference)
        if disagree or hedges(final, reference):
            return Score(0.0, "ok", final)
        return Score(float(equivalent(final, reference)), "ok", final)

    return score


_INTEGER = re.compile(r"\d+")


def aime_verifier(*, extract: Sequence[str] = ("boxed",)) -> Verifier:
    modes = _check_modes(extract)

    def score(response: str, reference: str) -> Score:
        ref = normalize(reference)
        if not _INTEGER.fullmatch(ref):
            return Score(0.0, "error", None)
        candidates = _candidates(response, modes)
        if not candidates:
            return Score(0.0, "no_answer", None)
        final, disagree = _final_answer(candidates, reference)
        answer = normalize(final)
        valid = _INTEGER.fullmatch(answer) is not None and int(answer) <= 999
        return Score(float(valid and not disagree and int(answer) == int(ref)), "ok", final)

    return score


def _gsm8k_number(text: str) -> frozenset | None:
    return numeric_values(text.replace(",", "").replace("$", "").strip().removesuffix("."))


def gsm8k_verifier() -> Verifier:
    def score(response: str, reference: str) -> Score:
        ref = _gsm8k_number(after_hashes(reference) or reference)
        if ref is None:
            return Score(0.0, "error", None)
        marked = after_hashes(response)
        boxes = [] if marked else boxed_answers(response)
        final = marked or (boxes[-1] if boxes else None) or last_number(response)
        if final is None:
            return Score(0.0, "no_answer", None)
        if len({normalize(b) for b in boxes}) > 1:
            return Score(0.0, "ok", final)
        value = _gsm8k_number(final)
        return Score(float(value is not None and not value.isdisjoint(ref)), "ok", final)

    return score


def exact_verifier(*, extract: Sequence[str] = ("boxed",), ignore_case: bool = False) -> Verifier:
    modes = _check_modes(extract)

    def score(response: str, reference: str) -> Score:
        candidates = _candidates(response, modes)
        if not candidates:
            return Score(0.0, "no_answer", None)
        final, ref = candidates[-1].strip(), reference.strip()
        if ignore_case:
            return Score(float(final.casefold() == ref.casefold()), "ok", final)
        return Score(float(final == ref), "ok", final)

    return score


def regex_verifier(*, extract: Sequence[str] = ("boxed",), ignore_case: bool = False) -> Verifier:
    modes = _check_modes(extract)
    flags = re.IGNORECASE if ignore_case else 0

    def score(response: str, reference: str) -> Score:
        try:
            pattern = re.compile(reference.strip(), flags)
        except re.error:
            return Score(0.0, "error", None)
        candidates = _candidates(response, modes)
        if not candidates:
            return Score(0.0, "no_answer", None)
        final = candidates[-1].strip()
        return Score(float(pattern.fullmatch(final) is not None), "ok", final)

    return score


VERIFIERS: dict[str, Callable[..., Verifier]] = {
    "math": math_verifier,
    "aime": aime_verifier,
    "gsm8k": gsm8k_verifier,
    "exact": exact_verifier,
    "regex": regex_verifier,
    "reasoning_gym": reasoning_gym_verifier,  # reasoning-gym's own scorers (reasoning_gym.py)
}


def get_verifier(name: str, **options) -> Verifier:
    """The verifier called `name` (a built-in or `module:function`), configured by `options`."""
    if name in VERIFIERS:
        try:
            return VERIFIERS[name](**options)
        except TypeError as e:
            raise ValueError(f"verifier {name!r}: bad options {sorted(options)} ({e})") from None
    if ":" in name:
        return load_custom(name, **options)
    raise ValueError(f"unknown verifier {name!r}; choose from {sorted(VERIFIERS)} or 'module:function'")
