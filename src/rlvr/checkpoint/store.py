"""Atomic checkpoints of a run: written to a temporary folder, checksummed, then renamed.

    run_dir/checkpoints/step_000020/
        trainer/       sharded trainable weights + optimizer (torch.distributed.checkpoint),
                       each rank's schedule and RNG
        adapter/       the LoRA adapter in PEFT format (loads with peft and vLLM as it is)
        state.json     controller state: step, data position
        manifest.json  every file above with its size and sha256, written last

A folder is a checkpoint only once renamed from its `.tmp` name, and only if its manifest
matches its files; `latest()` skips (and says so) any that does not, so a crash or a full
disk mid-write leaves the previous checkpoint the one that resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from rlvr.errors import UserError

MANIFEST = "manifest.json"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that could not be written (a full disk, a read-only folder): said in one line."""


class CheckpointStore:
    def __init__(self, run_dir: str | Path, keep: int = 2, log=print):
        self.root = Path(run_dir) / "checkpoints"
        self.keep, self.log = keep, log

    def save(self, step: int, state: dict, write_parts) -> Path:
        """`write_parts(folder)` writes the trainer's and adapter's files into `folder`."""
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".step_{step:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            write_parts(tmp)
            (tmp / "state.json").write_text(json.dumps(state, indent=2))
            files = {str(p.relative_to(tmp)): _digest(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
            (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=2))
            _fsync_tree(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except OSError as err:
            shutil.rmtree(tmp, ignore_errors=True)
            previous = self.latest(verbose=False)
            kept = f"; the previous checkpoint {previous.name} is intact" if previous else ""
            raise CheckpointError(
                f"checkpoint of step {step} failed in {self.root}: {err.strerror or err}{kept}"
            ) from err
        self._prune()
        return final

    def latest(self, verbose: bool = True) -> Path | None:
        """The newest checkpoint whose files match its manifest; broken ones are skipped."""
        for folder in sorted(self.root.glob("step_*"), reverse=True):
            problem = verify(folder)
            if problem is None:
                return folder
            if verbose:
                self.log(f"skipping checkpoint {folder}: {problem}")
        return None

    def _prune(self) -> None:
        for old in sorted(self.root.glob("step_*"), reverse=True)[self.keep :]:
            shutil.rmtree(old, ignore_errors=True)


def verify(folder: Path) -> str | None:
    """None if `folder` is a complete checkpoint, else what is wrong with it."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (partial write)"
    except json.JSONDecodeError:
        return "manifest is not valid JSON"
    for name, expected in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if _digest(path) != expected:
            return f"{name} does not match its checksum"
    return None


def read_state(folder: Path) -> dict:
    return json.loads((folder / "state.json").read_text())


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{path.stat().st_size}:{h.hexdigest()}"


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
