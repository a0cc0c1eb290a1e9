"""One dataset row as a `Problem`: field mapping, verl/SkyRL rows, and the verifier a row names.

Rules (`where` is the `file:row` every error starts with):
- Question: `problem_field`, else the first present of `problem`/`question`/`prompt`. A string
  is the question. A list of chat messages (the verl/SkyRL `prompt`: objects with string `role`
  and `content`) becomes `Problem.messages`, sent as they are, and the question is the content
  of its last user message.
- Answer: `answer_field`, else the first present of `answer`/`ground_truth`/
  `reward_spec.ground_truth` (SkyRL)/`reward_model.ground_truth` (verl); a dotted name reads a
  nested field. GSM8K-style answers holding `####` are reduced to the number after it, commas
  removed. A list or object answer is kept as JSON text, for a custom verifier to read. An
  empty or null answer raises `EmptyAnswer`.
- Verifier: `data_source` (verl, SkyRL), else SkyRL's `env_class`, looked up in
  `DATA_SOURCE_VERIFIERS` (case-insensitive), else by `VERIFIER_PREFIXES`; the match goes to
  `meta["verifier"]`. A row with an unknown source gets none: the run's `reward.verifier`
  scores it.
- `Problem.id` is the row's `id`/`unique_id` when present, else `SOURCE-ROW`; `meta` keeps
  the row's other short scalar fields (subject, level, data_source...) and `source`.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.records import Problem

PROBLEM_FIELDS = ("problem", "question", "prompt")


def read_json_array(path: Path) -> list:
    """A .json file holding an array of rows; a one-line error naming the file (and line) otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of objects, got {type(data).__name__}")
    return data


ANSWER_FIELDS = ("answer", "ground_truth", "reward_spec.ground_truth", "reward_model.ground_truth")
ROLES = ("system", "user", "assistant", "tool")
_META_MAX_CHARS = 200

# The data_source names verl's reward functions dispatch on (verl.utils.reward_score), SkyRL's
# env_class names, and the common dataset names, mapped to the rlvr verifier that fits.
DATA_SOURCE_VERIFIERS: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/math": "math",
    "digitallearninggmbh/math-lighteval": "math",
    "huggingfaceh4/math-500": "math",
    "math": "math",
    "math_dapo": "math",
    "math_dapo_reasoning": "math",
    "hiyouga/geometry3k": "math",
    "agentica-org/deepscaler-preview-dataset": "math",
}
# Families named by a prefix: verl sends every `aime*` source to one scorer, `numina_*` to another.
VERIFIER_PREFIXES: tuple[tuple[str, str], ...] = (("aime", "aime"), ("numina_", "math"))


class EmptyAnswer(ValueError):
    """A row whose answer is empty or null (some built-in sets drop these instead)."""


_MISSING = object()


def _get(row: dict, name: str) -> object:
    """`row[name]`, a dotted name reading nested objects; `_MISSING` when absent."""
    node: object = row
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _pick(row: dict, given: str | None, candidates: tuple[str, ...], where: str, role: str) -> str:
    if given is not None:
        if _get(row, given) is _MISSING:
            raise ValueError(f'{where}: missing field "{given}"')
        return given
    for name in candidates:
        if _get(row, name) is not _MISSING:
            return name
    raise ValueError(f"{where}: missing {role} field (looked for {', '.join(map(repr, candidates))})")


def verifier_for_source(source: str) -> str | None:
    """The rlvr verifier for a verl/SkyRL `data_source` (or `env_class`), None if unknown."""
    key = source.strip().lower()
    if key in DATA_SOURCE_VERIFIERS:
        return DATA_SOURCE_VERIFIERS[key]
    return next((verifier for prefix, verifier in VERIFIER_PREFIXES if key.startswith(prefix)), None)


def _messages(value: list, where: str, field: str) -> tuple[dict, ...]:
    messages = []
    for i, message in enumerate(value, 1):
        if not isinstance(message, dict):
            raise ValueError(
                f'{where}: field "{field}": message {i} is {type(message).__name__}, expected an object with role and content'
            )
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(
                f'{where}: field "{field}": message {i} has role {role!r}; expected one of {", ".join(ROLES)}'
            )
        if not isinstance(content, str):
            raise ValueError(
                f'{where}: field "{field}": message {i} has no text content (got {type(content).__name__})'
            )
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in messages):
        raise ValueError(f'{where}: field "{field}": no user message')
    return tuple(messages)


def _reference(answer: object) -> str:
    if isinstance(answer, (list, dict)):
        return json.dumps(answer, ensure_ascii=False)
    text = str(answer).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip().replace(",", "")
    return text


def row_to_problem(
    row: object,
    where: str,
    source: str,
    row_no: int,
    *,
    problem_field: str | None = None,
    answer_field: str | None = None,
) -> Problem:
    """The row as a Problem (rules in the module doc); errors are one line starting with `where`."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    q_key = _pick(row, problem_field, PROBLEM_FIELDS, where, "problem")
    a_key = _pick(row, answer_field, ANSWER_FIELDS, where, "answer")
    question, messages = _get(row, q_key), None
    if isinstance(question, list):
        messages = _messages(question, where, q_key)
        question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    elif not isinstance(question, (str, int, float)) or isinstance(question, bool):
        raise ValueError(
            f'{where}: field "{q_key}" is {type(question).__name__}; expected text or a list of chat messages'
        )
    raw_answer = _get(row, a_key)
    answer = _reference(raw_answer) if raw_answer is not None else ""
    if not answer:
        raise EmptyAnswer(f'{where}: empty field "{a_key}"')
    top_keys = {q_key.split(".")[0], a_key.split(".")[0], "id", "unique_id"}
    meta = {
        k: v
        for k, v in row.items()
        if k not in top_keys and isinstance(v, (str, int, float)) and len(str(v)) <= _META_MAX_CHARS
    }
    meta["source"] = source
    named = row.get("data_source") or row.get("env_class")
    if isinstance(named, str) and (verifier := verifier_for_source(named)):
        meta["verifier"] = verifier
    problem_id = str(row.get("id", row.get("unique_id", f"{source}-{row_no}")))
    return Problem(id=problem_id, question=str(question), answer=answer, meta=meta, messages=messages)
