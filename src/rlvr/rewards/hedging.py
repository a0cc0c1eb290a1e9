"""When a response hedges: offers several answers where one is expected. Hedges score 0.

- A reference is *scalar* when it names one value: no comma (thousands separators aside),
  `;`, `\\pm`/`\\mp`, "or"/"and", `\\cup`, or matrix at any depth. Tuples, sets, intervals and
  lists are not scalar; for them the equivalence check alone decides.
- Against a scalar reference, an answer that lists candidates (`3, 5`, `3 \\text{ or } 5`,
  `\\pm 2`) is a hedge.
- Several boxed answers that are not all equivalent are a hedge (the verifier checks this;
  see `verifiers.py`).
"""

from __future__ import annotations

import re

from rlvr.rewards.equivalence import normalize

_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:,|\{,\})\d{3})+(?![\d])")
_SEVERAL = re.compile(
    r"[,;]|\\(?:pm|mp|cup)(?![A-Za-z])|\\begin\{[pbvB]?matrix\}"
    r"|(?<![A-Za-z])(?:or|and)(?![A-Za-z])",
)


def lists_several_values(answer: str) -> bool:
    """True when `answer` names more than one value (rules in the module doc)."""
    return _SEVERAL.search(_THOUSANDS.sub("0", normalize(answer))) is not None


def is_scalar(reference: str) -> bool:
    """True when the reference names a single value."""
    return not lists_several_values(reference)


def hedges(answer: str, reference: str) -> bool:
    """True when `answer` offers several candidates for a single-valued `reference`."""
    return is_scalar(reference) and lists_several_values(answer)
