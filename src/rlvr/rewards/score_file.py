"""`rlvr score`: score a JSONL file of responses through the sandboxed pool.

Each input row is a JSON object with string fields "response" and "answer" and an optional
"verifier" (overrides `verifier` for that row). Each output row is the input row plus "reward"
(float), "status" and "extracted" (the answer read, or null), and "detail" where the verifier
gives one. `options` configure the default verifier; for `code` rows `timeout_s` is the
sandbox's wall-clock limit per program, and the sandbox is checked before any worker starts. A bad row (not JSON, not an
object, a missing or non-string field) raises ValueError naming `file:line` and the key; with
`skip_bad` it is reported on stderr and left out of the output. The output is written to a
temporary file and renamed, so a failed run leaves no half-written file.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from rlvr.rewards.pool import ScoringPool
from rlvr.rewards.verifiers import VERIFIERS, get_verifier
from rlvr.tracking.terminal import console_for

BATCH_ROWS = 256
_REQUIRED = ("response", "answer")


def _parse_row(line: str, where: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in (*_REQUIRED, "verifier"):
        if key not in row:
            if key in _REQUIRED:
                raise ValueError(f'{where}: missing field "{key}"')
        elif not isinstance(row[key], str):
            raise ValueError(f'{where}: field "{key}" must be a string, got {type(row[key]).__name__}')
    return row


def _read_rows(in_path: Path, skip_bad: bool, console: Console) -> tuple[list[dict], int]:
    rows, skipped = [], 0
    with in_path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(_parse_row(line, f"{in_path}:{line_no}"))
            except ValueError as e:
                if not skip_bad:
                    raise
                skipped += 1
                console.print(f"skipped {e}", markup=False, highlight=False)
    return rows, skipped


def score_file(
    in_path: str | Path,
    out_path: str | Path,
    *,
    verifier: str = "math",
    skip_bad: bool = False,
    workers: int = 2,
    timeout_s: float = 2.0,
    options: dict | None = None,
) -> dict:
    """Score `in_path` into `out_path`; returns counts by status (plus "skipped").

    `options` configure `verifier` (not the rows that name their own)."""
    in_path, out_path = Path(in_path), Path(out_path)
    console = console_for(stderr=True)
    rows, skipped = _read_rows(in_path, skip_bad, console)
    item_timeout_s = timeout_s
    if verifier == "code" or any(r.get("verifier") == "code" for r in rows):
        from rlvr.rewards.code_tests import prepare_scoring

        code_options, item_timeout_s, isolation = prepare_scoring(
            (options or {}) if verifier == "code" else {}, timeout_s
        )
        options = code_options if verifier == "code" else options
        if isolation != "strict":
            console.print(f"WARNING sandbox isolation {isolation}", markup=False, highlight=False)
    if options and verifier in VERIFIERS and verifier != "code":
        get_verifier(verifier, **options)  # bad options: one line here, not an error on every row
    counts: Counter = Counter({s: 0 for s in ("ok", "no_answer", "timeout", "error")})
    tmp_path = out_path.with_name(out_path.name + ".tmp")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with (
            ScoringPool(verifier, workers=workers, timeout_s=item_timeout_s, options=options) as pool,
            tmp_path.open("w", encoding="utf-8") as out,
        ):
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("scoring", total=len(rows))
                for start in range(0, len(rows), BATCH_ROWS):
                    batch = rows[start : start + BATCH_ROWS]
                    scores = pool.score(
                        [r["response"] for r in batch],
                        [r["answer"] for r in batch],
                        [r.get("verifier", verifier) for r in batch],
                    )
                    for row, score in zip(batch, scores):
                        counts[score.status] += 1
                        scored = {**row, "reward": score.reward, "status": score.status, "extracted": score.extracted}
                        if score.detail is not None:
                            scored["detail"] = score.detail
                        out.write(json.dumps(scored) + "\n")
                    progress.advance(task, len(batch))
        os.replace(tmp_path, out_path)
    finally:
        tmp_path.unlink(missing_ok=True)
    summary = dict(counts, skipped=skipped)
    console.print(
        f"scored {len(rows)} rows -> {out_path}: " + ", ".join(f"{k} {v}" for k, v in summary.items()),
        markup=False,
        highlight=False,
    )
    return summary
