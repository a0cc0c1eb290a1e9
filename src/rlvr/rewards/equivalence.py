"""Is a predicted final answer the same mathematical object as the reference?

`equivalent(pred, ref)` runs the checks cheapest first:

1. Normalised strings are equal (`normalize`: math delimiters, `\\left`/`\\right`, spacing
   commands, `\\dfrac`/`\\tfrac`, degree marks, `\\$`, `{,}`, `\\text{}` units after a number,
   a wrapping `\\text{...}`, a final period) -> equal.
2. Both are plain numbers (integers, decimals, thousands commas, `a/b`, `\\frac{a}{b}`,
   `\\frac12`, each optionally negative or with `%`) -> exact rational comparison decides.
   `X%` matches both `X` and `X/100`. Decimals are exact: `0.333` is not `\\frac13`.
3. An assignment `x = 3` against a bare `3` compares its right-hand side.
4. Otherwise math-verify parses both with latex2sympy2_extended (an ANTLR grammar: no `eval`,
   no `parse_expr`; plain numbers skip it) and compares symbolically: sets ignore order,
   tuples do not, open and closed interval ends differ, matrices compare entry-wise. Before
   that, two constants whose difference is numerically far from 0, or a constant against an
   expression with variables, are called different without running sympy's `simplify`.

Answers that could make sympy run away are compared as strings only: longer than
`MAX_SYMBOLIC_CHARS`, power towers (`10^{10^{10}}`), exponents or factorials of 5+ digits.
Results are cached per (pred, ref) pair, since a group of samples often repeats an answer.
No timeout is set here: the scoring pool bounds each item's time (see `pool.py`).
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction
from functools import lru_cache

import sympy
from math_verify import LatexExtractionConfig, parse, verify

MAX_SYMBOLIC_CHARS = 300

# math-verify warns once that its signal-based timeout is off; the pool owns timeouts.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_LATEX_ONLY = [LatexExtractionConfig(boxed_match_priority=0)]

_DELIMITERS = re.compile(r"^(?:\$+|\\\(|\\\[)\s*(.*?)\s*(?:\$+|\\\)|\\\])$", re.DOTALL)
_SPACING = re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])|(?<!\\)\\[!,;: ]|\\q?quad(?![A-Za-z])|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])")
_TEXT_CMD = r"\\(?:text|textbf|textrm|mathrm|mbox)"
_UNIT_AFTER_NUMBER = re.compile(rf"^(.*\d)\s*{_TEXT_CMD}\{{\s*[A-Za-z ]+\s*\}}(?:\^\{{?[23]\}}?)?$")
_WHOLE_TEXT = re.compile(rf"^{_TEXT_CMD}\{{([^{{}}]*)\}}$")
# Drop whitespace unless it separates two letters (`\pi r`, `New York`).
_SPACE = re.compile(r"(?<![A-Za-z])\s+|\s+(?![A-Za-z])")
_ASSIGNMENT = re.compile(r"^(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w+\}?)?=([^=]+)$")

_UNSIGNED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+")
_SLASH = re.compile(r"(\d+)/(\d+)")
_FRAC = re.compile(r"\\frac\{(-?\d+)\}\{(-?\d+)\}|\\frac(\d)(\d)")

_RUNAWAY = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\{?\d{5,}|\d{5,}\s*!")


def normalize(answer: str) -> str:
    """A canonical spelling of `answer` that keeps its meaning (rules in the module doc)."""
    s = answer.strip()
    while (m := _DELIMITERS.match(s)) is not None:
        s = m.group(1)
    s = _SPACING.sub(" ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DEGREES.sub("", s).replace("\\$", "").replace("{,}", ",")
    s = _SPACE.sub("", s).strip()
    s = s.removesuffix(".")
    if (m := _UNIT_AFTER_NUMBER.match(s)) is not None:
        s = m.group(1)
    if (m := _WHOLE_TEXT.match(s)) is not None:
        s = m.group(1).strip()
    return s


def numeric_values(s: str) -> frozenset[Fraction] | None:
    """The exact values a plain number can mean (two for a percentage), or None."""
    percent = s.endswith("%")
    body = s.removesuffix("%").removesuffix("\\")
    sign = -1 if body.startswith("-") else 1
    body = body.removeprefix("-")
    if _UNSIGNED.fullmatch(body):
        value = Fraction(body.replace(",", ""))
    elif (m := _SLASH.fullmatch(body)) and int(m.group(2)) != 0:
        value = Fraction(int(m.group(1)), int(m.group(2)))
    elif (m := _FRAC.fullmatch(body)) is not None:
        num, den = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
    else:
        return None
    value *= sign
    return frozenset({value, value / 100}) if percent else frozenset({value})


def _symbolic_safe(s: str) -> bool:
    return len(s) <= MAX_SYMBOLIC_CHARS and _RUNAWAY.search(s) is None


@lru_cache(maxsize=4096)
def _parsed(latex: str) -> tuple:
    values = numeric_values(latex)
    if values is not None and len(values) == 1:
        # A plain number needs no grammar: the ANTLR parser costs ~10-100 ms per call.
        (value,) = values
        return (sympy.Rational(value.numerator, value.denominator), latex)
    return tuple(parse("\\boxed{" + latex + "}", extraction_config=_LATEX_ONLY, parsing_timeout=None))


def _numeric_verdict(gold: object, target: object) -> bool | None:
    """False when two plain expressions surely differ, without sympy's simplify; else None.

    A constant never equals an expression with free variables, and two constants whose
    difference evaluates (30 digits) clearly away from zero differ.
    """
    if not (isinstance(gold, sympy.Expr) and isinstance(target, sympy.Expr)):
        return None
    if isinstance(gold, sympy.Symbol) or isinstance(target, sympy.Symbol):
        return None  # math-verify compares symbols as text ("A" vs "(A)")
    if bool(gold.free_symbols) != bool(target.free_symbols):
        return False
    if gold.free_symbols:
        return None
    try:
        diff = complex((gold - target).evalf(30))
        scale = max(1.0, abs(complex(gold.evalf(30))))
    except (TypeError, ValueError, ArithmeticError):
        return None
    return False if abs(diff) > 1e-9 * scale else None


def _symbolically_equal(pred: str, ref: str) -> bool:
    if not (_symbolic_safe(pred) and _symbolic_safe(ref)):
        return False
    gold, target = _parsed(ref), _parsed(pred)
    if not gold or not target:
        return False
    if _numeric_verdict(gold[0], target[0]) is False:
        return False
    return verify(list(gold), list(target), timeout_seconds=None)


@lru_cache(maxsize=8192)
def equivalent(pred: str, ref: str) -> bool:
    """True when `pred` and `ref` denote the same answer (rules in the module doc)."""
    p, r = normalize(pred), normalize(ref)
    if not p or not r:
        return False
    if p == r:
        return True
    if "=" not in r and (m := _ASSIGNMENT.match(p)) is not None:
        p = m.group(1)
    if "=" not in p and (m := _ASSIGNMENT.match(r)) is not None:
        r = m.group(1)
    if p == r:
        return True
    p_values, r_values = numeric_values(p), numeric_values(r)
    if p_values is not None and r_values is not None:
        return not p_values.isdisjoint(r_values)
    return _symbolically_equal(p, r)


def warm_up() -> None:
    """Pay sympy's first-call costs (lazy imports, caches; ~2 s) once, before real items."""
    for pred, ref in (
        ("2\\sqrt{3}", "\\sqrt{12}"),
        ("(1,2)", "[1,2)"),
        ("\\{1,2\\}", "\\{2,1\\}"),
        ("x^2+2x+1", "(x+1)^2"),
        ("\\begin{pmatrix}1&2\\end{pmatrix}", "\\begin{pmatrix}1&3\\end{pmatrix}"),
        ("\\frac{\\pi}{3}", "60^\\circ"),
    ):
        equivalent(pred, ref)
