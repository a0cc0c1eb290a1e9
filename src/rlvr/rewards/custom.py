"""Custom rewards named `module:function` (or `path/to/file.py:function`).

The function is called as `fn(response, answer, **options)` and returns a `Score`, a number or
bool (status "ok"), or None (status "no_answer"). A function marked with `@batched_reward`
is instead called once per batch as `fn(responses, answers, **options)` and returns a list of
those. Custom rewards run inside the scoring pool's workers, under the same timeout and memory
limit as the built-in verifiers.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from rlvr.records import Score


def batched_reward(fn: Callable) -> Callable:
    """Mark `fn(responses, answers, **options) -> list` as scoring a whole batch per call."""
    fn.batched = True
    return fn


def as_score(value: object) -> Score:
    """A custom function's return value as a Score (rules in the module doc)."""
    if isinstance(value, Score):
        return value
    if value is None:
        return Score(0.0, "no_answer", None)
    if isinstance(value, (bool, int, float)):
        return Score(float(value), "ok", None)
    raise TypeError(f"custom reward returned {type(value).__name__}; expected Score, number, bool or None")


def _import_function(spec: str) -> Callable:
    module_name, sep, function_name = spec.rpartition(":")
    if not sep or not module_name or not function_name:
        raise ValueError(f"custom reward {spec!r}: expected 'module:function' or 'file.py:function'")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"custom reward {spec!r}: no file {path}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn = getattr(module, function_name, None)
    if not callable(fn):
        raise ValueError(f"custom reward {spec!r}: {module_name} has no function {function_name!r}")
    return fn


def load_custom(spec: str, **options) -> Callable[[str, str], Score]:
    """A verifier for the custom function `spec`; batched ones also get `.score_batch`."""
    fn = _import_function(spec)
    if getattr(fn, "batched", False):

        def score_batch(responses: list[str], answers: list[str]) -> list[Score]:
            values = list(fn(responses, answers, **options))
            if len(values) != len(responses):
                raise ValueError(f"custom reward {spec!r} returned {len(values)} scores for {len(responses)} items")
            return [as_score(v) for v in values]

        def score_one(response: str, answer: str) -> Score:
            return score_batch([response], [answer])[0]

        score_one.score_batch = score_batch
        return score_one

    def score(response: str, answer: str) -> Score:
        return as_score(fn(response, answer, **options))

    return score
