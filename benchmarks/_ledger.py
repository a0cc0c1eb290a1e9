"""What a benchmark leaves behind: its result as JSON, and one line in docs/benchmarks.md that
says what was measured, the command that reproduces it, the machine and the date."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path

LEDGER = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
LEDGER_HEADER = "# Benchmarks\n\nOne line per run: what, command, machine, date, result.\n\n"


def provenance() -> dict[str, str]:
    """The machine and the date, as every result and ledger line states them."""
    return {
        "machine": f"{platform.machine()} {os.cpu_count()}-core CPU, Python {platform.python_version()}",
        "date": datetime.date.today().isoformat(),
    }


def write_result(out: Path, result: dict) -> None:
    """`result` as JSON at `out`, and on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def append_line(what: str, result: dict) -> None:
    """`- WHAT | `python benchmarks/SCRIPT ARGS` | machine | date` at the end of the ledger, which
    every benchmark shares, so it is only ever appended to."""
    command = f"python benchmarks/{Path(sys.argv[0]).name} " + " ".join(sys.argv[1:])
    if not LEDGER.exists():
        LEDGER.parent.mkdir(parents=True, exist_ok=True)
        LEDGER.write_text(LEDGER_HEADER)
    with LEDGER.open("a") as f:
        f.write(f"- {what} | `{command}` | {result['machine']} | {result['date']}\n")
