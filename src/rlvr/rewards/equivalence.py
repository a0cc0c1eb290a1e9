"""Is a predicted final answer the same mathematical object as the reference?

`equivalent(pred, ref, rules)` runs the checks cheapest first:

1. Multiple-choice letters: when one side is a bare choice letter (`C`, `(C)`, `\\text{C}`), the
   other side counts by its leading choice label (`C`, `(C) Cecile`, `C. x = 42`).
2. Normalised strings are equal. Letter case: math-verify compares symbols case-insensitively,
   so by default (`rules.ignore_case=True`) `X` and `x` match everywhere; with
   `ignore_case=False`, answers whose letters differ only in case are different.
3. An assignment `x = 3` against a bare `3` compares its right-hand side.
4. Both are plain numbers (integers, decimals, `a/b`, `\\frac{a}{b}`, `\\frac12`, signs, `%`,
   mixed numbers) -> exact rational comparison decides. Decimals are exact: `0.333` is not
   `\\frac13`. `X%` means X or X/100 (`rules.percent="either"`), only X/100 ("ratio") or only X
   ("number").
5. Bare lists with the same items (in any order, `,` or `;` between them) are equal.
6. Otherwise math-verify parses both with latex2sympy2_extended (an ANTLR grammar: no `eval`,
   no `parse_expr`; plain numbers skip it) and compares symbolically: sets and bare lists ignore
   order, tuples do not, open and closed interval ends differ, an interval equals the inequality
   it solves, matrices compare entry-wise. Before that, two constants whose difference is
   numerically far from 0, or a constant against an expression with variables, are called
   different without running sympy's `simplify`.

`normalize` keeps meaning and drops spelling: math delimiters and stray `$`, doubled escapes
(`\\\\frac` -> `\\frac`), `\\left`/`\\right`, spacing commands, `\\dfrac`/`\\tfrac`/`\\cfrac`, degree
marks, `\\$`, percent words (`28 percent`, `pct`, `percentage` -> `28%`), `\\text{}` units after a
number, `\\text{}` wrappers, a wrapping `{}` group, a final `.`, `,` or `;` (sentence punctuation).
Commas between digits:

- `{,}` and `,\\!` are number separators: thousands before exactly three digits (`14{,}916`),
  else a decimal comma (`3{,}14`) unless `rules.decimal_comma="never"`.
- `1,234,567` (groups of three, no spaces) is one number. A comma followed by a space always
  separates list items: `32, 349` is two numbers, never 32349.
- Any other comma between digits (`1000,99`, `1,5`) is ambiguous: with `decimal_comma="auto"`
  it is a decimal comma when the other answer is a plain number, else a list separator;
  "never" makes it a list separator, "always" a decimal comma (and turns off thousands commas).
- Spaced thousands (`1 000`, `2\\,000`) are one number; `4 4/9` is the mixed number 40/9 when the
  fraction is proper (numerator below denominator), as `4\\frac{4}{9}` is.

List commas are spelled `, ` after normalisation. Answers that could make the parser or sympy
run away are compared as strings only: longer than `MAX_SYMBOLIC_CHARS`, nested deeper than
`MAX_SYMBOLIC_DEPTH` brackets or braces (the grammar's cost grows steeply with depth: ~1.5 s at
10 levels), power towers (`10^{10^{10}}`), exponents or factorials of 5+ digits, binomials with
4+ digit arguments (sympy expands `\\binom{y}{128910}`). Numbers longer
than `MAX_NUMBER_DIGITS` digits are not read as numbers (Python refuses int conversions over
4300 digits, and the work is quadratic): they match their own spelling only. Results are cached
per (pred, ref, rules) for answers up to `MAX_CACHED_CHARS` together, since a group of samples
often repeats an answer. No timeout is set here: the scoring pool bounds each item.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import sympy
from math_verify import LatexExtractionConfig, parse, verify

MAX_SYMBOLIC_CHARS = 300
MAX_SYMBOLIC_DEPTH = 6
MAX_NUMBER_DIGITS = 1000
MAX_CACHED_CHARS = 2000
PERCENT_POLICIES = ("either", "ratio", "number")
DECIMAL_COMMA_POLICIES = ("auto", "never", "always")

# math-verify warns once that its signal-based timeout is off; the pool owns timeouts.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_LATEX_ONLY = [LatexExtractionConfig(boxed_match_priority=0)]


@dataclass(frozen=True)
class Rules:
    """How answers are read; the `math` verifier's options `percent`, `decimal_comma`, `ignore_case`."""

    percent: str = "either"
    decimal_comma: str = "auto"
    ignore_case: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("percent", PERCENT_POLICIES), ("decimal_comma", DECIMAL_COMMA_POLICIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"option {name}={getattr(self, name)!r}: choose from {', '.join(allowed)}")
        if not isinstance(self.ignore_case, bool):
            raise ValueError(f"option ignore_case={self.ignore_case!r}: expected true or false")


DEFAULT_RULES = Rules()

_DELIMITERS = re.compile(r"^(?:\$+|\\\(|\\\[)\s*(.*?)\s*(?:\$+|\\\)|\\\])$", re.DOTALL)
_STRAY_DOLLAR = re.compile(r"(?<!\\)\$")
# `\\frac` from doubly escaped text (JSON, Python literals): LaTeX's line break never precedes these
# directly. `\\\frac` (a matrix row break, then `\frac`) is left alone.
_DOUBLE_ESCAPE = re.compile(
    r"(?<!\\)\\\\(?=(?:[dtc]?frac|sqrt|left|right|text\w*|mathrm|mbox|boxed|pi|infty|cdot|times|le|leq|ge|geq|lt|gt|neq|ne"
    r"|in|cup|cap|pm|mp|circ|sin|cos|tan|log|ln|quad|qquad|alpha|beta|gamma|theta)(?![A-Za-z]))"
)
_SPACING = re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])|(?<!\\)\\[!,;: ]|\\q?quad(?![A-Za-z])|~")
_FRAC_VARIANT = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])")
_TEXT_CMD = r"\\(?:text|textbf|textrm|textnormal|mathrm|mbox)"
_PERCENT_WORD = re.compile(
    rf"(?<=\d)\s*(?:{_TEXT_CMD}\s*\{{\s*(?:percent(?:age)?|pct|per\s*cent)\s*\}}|(?:percent(?:age)?|pct|per\s*cent)(?![A-Za-z]))",
    re.IGNORECASE,
)
_GROUP_SEPARATOR = re.compile(r"(?<=\d)(?:\{\s*,\s*\}|,\\!\s*)(?=\d)")
_THOUSANDS = re.compile(r"(?<![\d.])(?<!\d,)[1-9]\d{0,2}(?:,\d{3})+(?!\d|,\d)")
_SPACED_THOUSANDS = re.compile(r"(?<![\d.,/])\d{1,3}(?:[ \t]\d{3})+(?![\d/]|[ \t]?[.,]\d)")
_MIXED = re.compile(r"(?<![\w.,/)])([+-]?)(\d+)[ \t]+(\d+)/(\d+)(?![\w./(])")
_COMMA_BETWEEN_DIGITS = re.compile(r"(?<=\d),(?=\d)")
# No leading `\s*`: tried at every space of a long run it would cost quadratic time; the spaces
# around a list mark go with the other spaces.
_LIST_COMMA = re.compile(
    rf",\s+|,(?!\d)|(?<!\d),|{_TEXT_CMD}\s*\{{\s*(?:and|or)\s*\}}|(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])"
)
_LIST_MARK = "\ue000"  # a private-use character stands for ", " while spaces are dropped
_UNIT_AFTER_NUMBER = re.compile(rf"^(.*\d)\s*{_TEXT_CMD}\{{\s*[A-Za-z ]+\s*\}}(?:\^\{{?[23]\}}?)?$")
_TEXT_WRAPPER = re.compile(rf"{_TEXT_CMD}\{{([^{{}}]*)\}}")
# Drop whitespace unless it separates two letters (`\pi r`, `New York`).
_SPACE = re.compile(r"(?<![A-Za-z])\s+|\s+(?![A-Za-z])")
_ASSIGNMENT = re.compile(r"^(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w+\}?)?=([^=]+)$")
_CHOICE_ONLY = re.compile(rf"^\s*(?:{_TEXT_CMD}\s*\{{\s*)?\(?([A-Z])\)?\s*\}}?\s*\.?\s*$")
_CHOICE_LABEL = re.compile(rf"^\s*(?:{_TEXT_CMD}\s*\{{\s*)?(?:\(([A-Z])\)|([A-Z])(?:[.:)]|\s+(?=[A-Za-z]{{2}})))")

_COMMAND = re.compile(r"\\[A-Za-z]+")
_UNSIGNED = re.compile(r"\d+(?:\.\d+)?|\.\d+")
_SLASH = re.compile(r"(\d+)/(\d+)")
_FRAC = re.compile(r"\\frac\{(-?\d+)\}\{(-?\d+)\}|\\frac(\d)(\d)")
_AMBIGUOUS_COMMA_NUMBER = re.compile(r"([+-]?\d+),(\d+)(%?)")

_RUNAWAY = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\{?\d{5,}|\d{5,}\s*!|\\binom\s*\{[^{}]*\}?\s*\{?[^{}]*\d{4,}")


def _numeric_separators(s: str, decimal_comma: str) -> str:
    """Commas between digits resolved as thousands, decimal or list separators (module doc)."""

    def group(m: re.Match) -> str:
        three_digits = re.match(r"\d{3}(?!\d)", s[m.end() :]) is not None
        if decimal_comma == "always" or (not three_digits and decimal_comma == "auto"):
            return "."
        return "" if three_digits else ", "

    s = _GROUP_SEPARATOR.sub(group, s)
    if decimal_comma == "always":
        return _COMMA_BETWEEN_DIGITS.sub(".", s)
    s = _THOUSANDS.sub(lambda m: m.group(0) if _bracketed(s, m) else m.group(0).replace(",", ""), s)
    return _SPACED_THOUSANDS.sub(lambda m: re.sub(r"[ \t]", "", m.group(0)), s)


def _bracketed(s: str, m: re.Match) -> bool:
    """True for `(12,102)`: alone in brackets, digit groups are a pair, not one number."""
    return s[: m.start()].rstrip().endswith(("(", "[", "\\{")) and s[m.end() :].lstrip().startswith((")", "]", "\\}"))


def _mixed_number(m: re.Match) -> str:
    sign, whole, num, den = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if den == 0 or num >= den:
        return m.group(0)  # not a proper mixed number: left as written
    return f"{'-' if sign == '-' else ''}{whole * den + num}/{den}"


def normalize(answer: str, rules: Rules = DEFAULT_RULES) -> str:
    """A canonical spelling of `answer` that keeps its meaning (rules in the module doc)."""
    s = answer.strip()
    for _ in range(3):  # `$\(x\)$` at most; `$ $ $ ...` would otherwise peel one layer per pass
        if (m := _DELIMITERS.match(s)) is None:
            break
        s = m.group(1)
    if "\\begin" not in s:  # in a matrix `\\` is a row break
        s = _DOUBLE_ESCAPE.sub(r"\\", s)
    s = _STRAY_DOLLAR.sub("", s)
    s = _GROUP_SEPARATOR.sub(lambda m: "{,}", s)  # `,\!` before `\!` is read as spacing
    s = _SPACING.sub(" ", s)
    s = _FRAC_VARIANT.sub(r"\\frac", s)
    s = _DEGREES.sub("", s).replace("\\$", "").replace("\\%", "%")
    s = _PERCENT_WORD.sub("%", s)
    s = _numeric_separators(s, rules.decimal_comma)
    s = _MIXED.sub(_mixed_number, s)
    # A comma that a space follows, or that is not between two digits, separates list items.
    s = _LIST_COMMA.sub(_LIST_MARK, s.replace(_LIST_MARK, ""))
    if rules.decimal_comma == "never":
        s = s.replace(",", _LIST_MARK)
    s = _SPACE.sub("", s).replace(_LIST_MARK, ", ")
    s = s.strip()
    if s.endswith((".", ",", ";")) and not s.endswith(".."):
        s = s[:-1].strip()  # sentence punctuation written inside the math, not part of the answer
    if s.endswith("\\") and not s.endswith("\\\\"):
        s = s[:-1]  # a dangling escape
    if (m := _UNIT_AFTER_NUMBER.match(s)) is not None:
        s = m.group(1)
    s = _TEXT_WRAPPER.sub(lambda m: m.group(1).strip(), s)
    if s.startswith("{") and s.endswith("}") and _closes_at_end(s):
        s = s[1:-1].strip()
    return s


def _closes_at_end(s: str) -> bool:
    """True when the `{` at s[0] is closed by the `}` at s[-1] (one wrapping group)."""
    depth = 0
    i = 0
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth == 0:
            return i == len(s) - 1
        i += 1
    return False


def numeric_values(s: str, percent: str = "either") -> frozenset[Fraction] | None:
    """The exact values a normalised plain number can mean (two for a percentage), or None."""
    if len(s) > MAX_NUMBER_DIGITS + 8:
        return None
    is_percent = s.endswith("%")
    body = s.removesuffix("%")
    sign = -1 if body.startswith("-") else 1
    body = body.removeprefix("-") if sign < 0 else body.removeprefix("+")
    if _UNSIGNED.fullmatch(body):
        value = Fraction(body)
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
    if not is_percent:
        return frozenset({value})
    return frozenset({"either": (value, value / 100), "ratio": (value / 100,), "number": (value,)}[percent])


def decimal_comma_values(s: str, percent: str = "either") -> frozenset[Fraction] | None:
    """The values of a normalised `1000,99` read with a decimal comma, or None for other text."""
    m = _AMBIGUOUS_COMMA_NUMBER.fullmatch(s)
    return numeric_values(f"{m.group(1)}.{m.group(2)}{m.group(3)}", percent) if m else None


def top_level_items(s: str, *, sets_shelter: bool = True) -> list[str]:
    """`s` split at `,` and `;` outside parentheses, brackets and groups; with `sets_shelter`
    False, the commas of a set `\\{...\\}` split too (a set lists its members)."""
    items, depth, start, i = [], 0, 0, 0
    while i < len(s):
        ch = s[i]
        if ch == "\\":
            if s[i + 1 : i + 2] in ("{", "}") and sets_shelter:
                depth += 1 if s[i + 1] == "{" else -1
            i += 2 if s[i + 1 : i + 2] in ("{", "}") else 1
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth <= 0 and ch in ",;":
            items.append(s[start:i].strip())
            start = i + 1
        i += 1
    return [*items, s[start:].strip()]


def as_list(s: str) -> str:
    """`s` with its ambiguous digit commas read as list separators."""
    return _COMMA_BETWEEN_DIGITS.sub(", ", s)


def _nesting_depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")}]":
            depth -= 1
    return deepest


def _symbolic_safe(s: str) -> bool:
    return len(s) <= MAX_SYMBOLIC_CHARS and _RUNAWAY.search(s) is None and _nesting_depth(s) <= MAX_SYMBOLIC_DEPTH


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
    return verify(list(gold), list(target), allow_set_relation_comp=True, timeout_seconds=None)


def _choice_verdict(pred: str, ref: str) -> bool | None:
    """Same choice letter when one side is a bare letter and the other starts with a label."""
    for bare, labelled in ((pred, ref), (ref, pred)):
        if (only := _CHOICE_ONLY.match(bare)) is not None and (label := _CHOICE_LABEL.match(labelled)) is not None:
            return only.group(1) == (label.group(1) or label.group(2))
    return None


def _same_text(p: str, r: str, rules: Rules) -> bool:
    return p == r or (rules.ignore_case and p.casefold() == r.casefold())


def _letters(s: str) -> list[str]:
    return sorted(ch for ch in _COMMAND.sub("", s) if ch.isalpha())


def _differ_in_case_only(p: str, r: str) -> bool:
    """True when the two answers' letters (outside commands) are the same but for case."""
    lp, lr = _letters(p), _letters(r)
    return lp != lr and sorted(c.casefold() for c in lp) == sorted(c.casefold() for c in lr)


def equivalent(pred: str, ref: str, rules: Rules = DEFAULT_RULES) -> bool:
    """True when `pred` and `ref` denote the same answer (rules in the module doc)."""
    if len(pred) + len(ref) > MAX_CACHED_CHARS:  # a cache of megabyte answers would fill the memory limit
        return _equivalent(pred, ref, rules)
    return _equivalent_cached(pred, ref, rules)


def _equivalent(pred: str, ref: str, rules: Rules) -> bool:
    if (choice := _choice_verdict(pred, ref)) is not None:
        return choice
    p, r = normalize(pred, rules), normalize(ref, rules)
    if not p or not r:
        return False
    if _same_text(p, r, rules):
        return True
    if not rules.ignore_case and _differ_in_case_only(p, r):
        return False
    if "=" not in r and (m := _ASSIGNMENT.match(p)) is not None:
        p = m.group(1)
    if "=" not in p and (m := _ASSIGNMENT.match(r)) is not None:
        r = m.group(1)
    if _same_text(p, r, rules):
        return True
    p_values, r_values = numeric_values(p, rules.percent), numeric_values(r, rules.percent)
    if rules.decimal_comma == "auto" and (p_values is None) != (r_values is None):
        p_values = p_values or decimal_comma_values(p, rules.percent)
        r_values = r_values or decimal_comma_values(r, rules.percent)
    if p_values is not None and r_values is not None:
        return not p_values.isdisjoint(r_values)
    p, r = as_list(p), as_list(r)
    if _same_text(p, r, rules):
        return True
    p_items, r_items = top_level_items(p), top_level_items(r)
    if (
        len(p_items) > 1
        and len(p_items) == len(r_items)
        and _same_text("\x00".join(sorted(p_items)), "\x00".join(sorted(r_items)), rules)
    ):
        return True  # the same items in another order, or with `;` for `,`
    return _symbolically_equal(p, r)


_equivalent_cached = lru_cache(maxsize=8192)(_equivalent)


def warm_up() -> None:
    """Pay sympy's first-call costs (lazy imports, caches; ~2 s) once, before real items."""
    for pred, ref in (
        ("2\\sqrt{3}", "\\sqrt{12}"),
        ("(1,2)", "[1,2)"),
        ("\\{1,2\\}", "\\{2,1\\}"),
        ("x^2+2x+1", "(x+1)^2"),
        ("\\begin{pmatrix}1&2\\end{pmatrix}", "\\begin{pmatrix}1&3\\end{pmatrix}"),
        ("\\frac{\\pi}{3}", "60^\\circ"),
        ("(0,1)", "0<x<1"),
    ):
        equivalent(pred, ref)
