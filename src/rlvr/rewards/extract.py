"""Final-answer extraction: pull the answer a response commits to out of free text.

Rules (each function returns None when the text has no such answer):

- `boxed_answers`: the contents of every top-level `\\boxed{...}` / `\\fbox{...}`, in order.
  Braces are matched with a counter (so `\\boxed{\\frac{1}{2}}` is whole); `\\{` and `\\}` are
  literal braces, not grouping. `\\boxed 5` (no braces) takes the next token. A box whose braces
  never close (a truncated response) ends the scan. Empty boxes are skipped.
- `answer_line`: what follows the last `Answer:` or `answer is` on its line: the first math span
  there (`$...$`, `\\(...\\)`, `\\[...\\]`) when the line starts with one, else the text up to
  the end of the sentence (`. ` before a capital letter, or the line's end).
- `last_number`: the last number in the text (sign, thousands commas and decimals kept).
- `after_hashes`: the number after the last `####` (the GSM8K convention).
- `after_reasoning`: the text after the last reasoning-end marker (`</think>`), None when the
  reasoning was opened (`<think>`) and never closed, else the whole text: an answer written
  inside the reasoning is not the final answer.
- `reference_answer`: a reference holding boxes (a worked solution) reduced to its boxed
  answer(s), several distinct ones joined with ", "; other references unchanged.

All scans are linear in the text length and use no backtracking-prone patterns, so a 1 MB
response or 10,000 nested braces cost milliseconds.
"""

from __future__ import annotations

import re

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_MARKER = re.compile(r"\banswer\s*:|\banswer is\b:?", re.IGNORECASE)
_LEADING_MATH = re.compile(r"^(?:\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\])", re.DOTALL)
_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z])")
# Thousands groups first so "1,234.5" is one number, then plain decimals and integers.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")


def _closing_brace(text: str, open_at: int) -> int | None:
    """Index of the brace that closes the one at `open_at`, or None if it never closes."""
    depth = 0
    i = open_at
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # an escaped character (\{ \} \\) never opens or closes a group
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def boxed_answers(text: str) -> list[str]:
    """Contents of every top-level box in `text`, stripped, in order of appearance."""
    answers: list[str] = []
    pos = 0
    while True:
        match = _BOX_COMMAND.search(text, pos)
        if match is None:
            return answers
        i = match.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            close = _closing_brace(text, i)
            if close is None:
                return answers
            content, pos = text[i + 1 : close], close + 1
        else:
            token = re.match(r"[^\s$]*", text[i:]).group(0)
            content, pos = token, i + len(token)
        content = content.strip()
        if content:
            answers.append(content)


def last_boxed(text: str) -> str | None:
    """The content of the last box, the conventional final answer."""
    answers = boxed_answers(text)
    return answers[-1] if answers else None


def answer_line(text: str) -> str | None:
    """What the last `Answer:` / `answer is` states on its line (rules in the module doc)."""
    last = None
    for last in _ANSWER_MARKER.finditer(text):
        pass
    if last is None:
        return None
    line = text[last.end() :].split("\n", 1)[0].strip()
    if (math := _LEADING_MATH.match(line)) is not None:
        line = next(g for g in math.groups() if g is not None)
    else:
        line = _SENTENCE_END.split(line, 1)[0]
    line = line.strip().strip("$").strip().removesuffix(".").strip()
    return line or None


def last_number(text: str) -> str | None:
    """The last number written in `text`, e.g. "1,234.5" or "-3"."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return last.group(0) if last else None


def after_hashes(text: str) -> str | None:
    """The number after the last `####` marker, or None if there is no marker or no number."""
    at = text.rfind("####")
    if at < 0:
        return None
    match = _NUMBER.search(text[at + 4 :].lstrip().replace("$", "", 1)[:64])
    return match.group(0) if match else None


def after_reasoning(text: str, end_marker: str) -> str | None:
    """The text after the last `end_marker`; None if reasoning opened and never closed."""
    if not end_marker:
        return text
    at = text.rfind(end_marker)
    if at >= 0:
        return text[at + len(end_marker) :]
    if end_marker.startswith("</") and ("<" + end_marker[2:]) in text:
        return None
    return text


def reference_answer(reference: str) -> str:
    """A reference's boxed answer(s), distinct ones joined with ", "; else the reference itself."""
    boxes = list(dict.fromkeys(boxed_answers(reference)))
    return ", ".join(boxes) if boxes else reference
