"""Wall-clock spans of named functions in every process of a run, for benchmarks that cross
processes (a Ray actor, vLLM's engine core) and cannot time those stages from the driver.

`install(targets, folder)` here, or in a child through a `sitecustomize` that `sitecustomize_dir`
writes (Ray workers and vLLM's spawned processes inherit PYTHONPATH and the environment): when a
target module is imported, its named functions are wrapped, and each call appends
`{"pid", "name", "start", "end"}` to FOLDER/PID.jsonl. Nothing else is changed.
"""

from __future__ import annotations

import functools
import importlib.abc
import json
import os
import sys
import time
from pathlib import Path

ENV_FOLDER, ENV_TARGETS = "RLVR_CALL_TRACE_DIR", "RLVR_CALL_TRACE_TARGETS"


def _record(folder: str, name: str, fn):
    @functools.wraps(fn)
    def traced(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            line = json.dumps({"pid": os.getpid(), "name": name, "start": start, "end": time.time()})
            with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as f:
                f.write(line + "\n")

    return traced


def _wrap(module, names: list[str], folder: str) -> None:
    for name in names:
        owner_name, _, attr = name.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        label = f"{module.__name__}.{name}"
        if isinstance(raw, classmethod):
            setattr(owner, attr, classmethod(_record(folder, label, raw.__func__)))
        else:
            setattr(owner, attr, _record(folder, label, raw))


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, targets: dict[str, list[str]], folder: str):
        self.targets, self.folder = targets, folder

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module, self.targets[fullname], self.folder)

        spec.loader.exec_module = exec_and_wrap
        return spec


def install(targets: dict[str, list[str]] | None = None, folder: str | None = None) -> None:
    """Trace `targets` ({module: ["func", "Class.method"]}) here, and in children that run the
    sitecustomize from `sitecustomize_dir` (which reads them from the environment)."""
    targets = targets if targets is not None else json.loads(os.environ[ENV_TARGETS])
    folder = folder or os.environ[ENV_FOLDER]
    os.environ[ENV_TARGETS], os.environ[ENV_FOLDER] = json.dumps(targets), folder
    loaded = {name: names for name, names in targets.items() if name in sys.modules}
    for name, names in loaded.items():
        _wrap(sys.modules[name], names, folder)
    sys.meta_path.insert(0, _Finder({k: v for k, v in targets.items() if k not in loaded}, folder))


def sitecustomize_dir(folder: Path) -> Path:
    """A folder to put first on PYTHONPATH: its sitecustomize installs the tracer in each child."""
    folder.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    (folder / "sitecustomize.py").write_text(
        f"import os, sys\nif os.environ.get({ENV_FOLDER!r}):\n"
        f"    sys.path.insert(0, {str(here)!r})\n    import _call_trace\n    _call_trace.install()\n"
    )
    return folder


def spans(folder: str) -> list[dict]:
    return [json.loads(line) for file in Path(folder).glob("*.jsonl") for line in file.read_text().splitlines()]
