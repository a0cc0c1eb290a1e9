"""When a response hedges: offers several answers where one is expected. Hedges score 0.

- A reference is *scalar* when it names one value: after normalisation (`equivalence.normalize`,
  which turns "or"/"and" between items into list commas) it has no comma, `;`, `\\pm`/`\\mp`,
  `\\cup`, matrix, and no relation (`<`, `\\le`, `\\ge`, `\\neq`, `\\in`, ...). Tuples, sets,
  intervals, lists and inequalities name more than one value (an inequality names the set that
  solves it); for them the equivalence check alone decides.
- Against a scalar reference, an answer that lists candidates is a hedge: `3, 5`,
  `3 \\text{ or } 5`, `\\pm 2`, a set `\\{3, 5\\}`. Commas inside parentheses or brackets belong to
  one object (a point `(3, 5)`, an interval `[2, \\infty)`) and list nothing; such an answer is
  simply compared. A number written with a decimal comma (`1000,99`, read as one under
  `decimal_comma="auto"`) lists nothing either when the reference is a number.
- Several boxed answers that are not all equivalent are a hedge (the verifier checks this;
  see `verifiers.py`).
"""

from __future__ import annotations

import re

from rlvr.rewards.equivalence import (
    DEFAULT_RULES,
    Rules,
    decimal_comma_values,
    normalize,
    numeric_values,
    top_level_items,
)

_ALWAYS_SEVERAL = re.compile(r"\\(?:pm|mp|cup)(?![A-Za-z])|\\begin\{[pbvBV]?matrix\}")
_RELATION = re.compile(
    r"[<>≤≥≠]|!=|\\(?:le|ge|leq|geq|leqslant|geqslant|lt|gt|ne|neq|in|notin|subset|subseteq)(?![A-Za-z])"
)


def lists_several_values(answer: str, rules: Rules = DEFAULT_RULES) -> bool:
    """True when `answer` offers more than one candidate value (rules in the module doc)."""
    s = normalize(answer, rules)
    return _ALWAYS_SEVERAL.search(s) is not None or len(top_level_items(s, sets_shelter=False)) > 1


def is_scalar(reference: str, rules: Rules = DEFAULT_RULES) -> bool:
    """True when the reference names a single value."""
    s = normalize(reference, rules)
    return not (_ALWAYS_SEVERAL.search(s) or _RELATION.search(s) or re.search(r"[,;]", s))


def hedges(answer: str, reference: str, rules: Rules = DEFAULT_RULES) -> bool:
    """True when `answer` offers several candidates for a single-valued `reference`."""
    if not is_scalar(reference, rules):
        return False
    if rules.decimal_comma == "auto" and decimal_comma_values(normalize(answer, rules)) is not None:
        return numeric_values(normalize(reference, rules)) is None
    return lists_several_values(answer, rules)
