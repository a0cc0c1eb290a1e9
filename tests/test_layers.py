"""Imports run one way, down the layers: the stages never reach up into what drives them."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "rlvr"

# package -> the packages it must not import (at module level or inside a function)
FORBIDDEN = {
    pkg: ("rlvr.orchestration", "rlvr.eval", "rlvr.cli", "rlvr.demo", "rlvr.serve")
    for pkg in ("tracking", "algorithms", "quant", "rewards", "engines", "data", "training", "checkpoint", "sync", "rollout")
}
# the Tinker server is a thin layer over the same pieces the loop drives, never over the loop
FORBIDDEN["serve"] = ("rlvr.orchestration", "rlvr.eval", "rlvr.cli", "rlvr.demo")
FORBIDDEN["algorithms"] += ("rlvr.training", "rlvr.engines", "rlvr.rollout", "rlvr.sync")
FORBIDDEN["rewards"] += ("rlvr.training", "rlvr.engines", "rlvr.rollout", "rlvr.sync", "rlvr.algorithms")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_runs_up_the_layers(package):
    bad = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in sorted((SRC / package).rglob("*.py"))
        for name in imported_modules(path)
        if name.startswith(FORBIDDEN[package])
    ]
    assert bad == []
