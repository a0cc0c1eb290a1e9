"""Per-sample eval files (JSONL, one scored sample a line) and metrics recomputed from them.

A row is {"problem_id", "sample", "response", "extracted", "reward", "status", "answer"}:
the problem, the sample's index among that problem's samples, the generated text, the answer
the verifier extracted (null if none), its reward and status, and the reference answer.
Only problem_id, reward and extracted are needed to recompute the metrics
(`rlvr eval --from-rollouts`), so files from other tools can be re-scored the same way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from rlvr.eval.metrics import paired_difference, summarize


@dataclass(frozen=True)
class SampleRow:
    """One scored sample of one problem, as saved for inspection and re-scoring."""

    problem_id: str
    reward: float
    extracted: str | None
    sample: int | None = None  # order of the sample within its problem; maj@k takes the first k
    response: str | None = None  # the completion; for a multi-turn trajectory its whole transcript
    status: str | None = None
    answer: str | None = None  # the reference answer
    turns: int | None = None  # a multi-turn trajectory's model turns
    tool_calls: int | None = None


def write_samples(path: str | Path, rows: Iterable[SampleRow]) -> Path:
    """Write rows as JSONL (UTF-8, one object a line), creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(asdict(row), ensure_ascii=False) + "\n")
    return path


def _field_error(where: str, name: str, expected: str, value) -> ValueError:
    return ValueError(f"{where}: field {name!r} must be {expected}, got {value!r}")


def _parse_row(obj, where: str) -> SampleRow:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for name in ("problem_id", "reward", "extracted"):
        if name not in obj:
            raise ValueError(f"{where}: missing field {name!r}")
    problem_id = obj["problem_id"]
    if isinstance(problem_id, bool) or not isinstance(problem_id, (str, int)):
        raise _field_error(where, "problem_id", "a string or an integer", problem_id)
    reward = obj["reward"]
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise _field_error(where, "reward", "a finite number", reward)
    if obj["extracted"] is not None and not isinstance(obj["extracted"], str):
        raise _field_error(where, "extracted", "a string or null", obj["extracted"])
    sample = obj.get("sample")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 0):
        raise _field_error(where, "sample", "a non-negative integer or absent", sample)
    optional_text = {}
    for name in ("response", "status", "answer"):
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            raise _field_error(where, name, "a string, null or absent", value)
        optional_text[name] = value
    counts = {}
    for name in ("turns", "tool_calls"):
        value = obj.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise _field_error(where, name, "a non-negative integer, null or absent", value)
        counts[name] = value
    return SampleRow(
        problem_id=str(problem_id),
        reward=float(reward),
        extracted=obj["extracted"],
        sample=sample,
        **optional_text,
        **counts,
    )


def read_samples(path: str | Path) -> list[SampleRow]:
    """Read and check a sample file; a bad row raises a one-line ValueError naming file:line.

    Rows come back grouped by problem (problems in order of first appearance); a problem's
    rows are in file order, or by their "sample" index when all of them carry one (duplicate
    indices are an error). Blank lines are skipped.
    """
    path = Path(path)
    rows: list[SampleRow] = []
    seen: dict[tuple[str, int], int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            row = _parse_row(obj, where)
            if row.sample is not None:
                key = (row.problem_id, row.sample)
                if key in seen:
                    raise ValueError(
                        f"{where}: problem {row.problem_id!r} sample {row.sample} already given on line {seen[key]}"
                    )
                seen[key] = lineno
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no sample rows")
    by_problem: dict[str, list[SampleRow]] = {}
    for row in rows:
        by_problem.setdefault(row.problem_id, []).append(row)
    ordered = []
    for group in by_problem.values():
        if all(r.sample is not None for r in group):
            group = sorted(group, key=lambda r: r.sample)
        ordered.extend(group)
    return ordered


def summarize_rows(rows: list[SampleRow], ks: list[int]) -> dict:
    """summarize() over sample rows; references come from the rows' "answer" fields."""
    references = {r.problem_id: r.answer for r in rows if r.answer is not None}
    return summarize(
        [r.problem_id for r in rows],
        [r.reward for r in rows],
        [r.extracted for r in rows],
        references or None,
        ks,
    )


def metrics_from_rollouts(path: str | Path, ks: list[int]) -> dict:
    """Recompute avg@k / pass@k / maj@k (with standard errors) from a saved sample file."""
    return summarize_rows(read_samples(path), ks)


def paired_rows(before: list[SampleRow], after: list[SampleRow], ks: list[int]) -> dict:
    """paired_difference() of two evaluations' sample rows (after - before, paired by problem)."""

    def columns(rows: list[SampleRow]) -> tuple[list[str], list[float], list[str | None]]:
        return [r.problem_id for r in rows], [r.reward for r in rows], [r.extracted for r in rows]

    return paired_difference(columns(before), columns(after), ks)
