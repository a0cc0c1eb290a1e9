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
# the Tinker server is a thin layer over the same pieces the loop drives, never over the loop: of
# orchestration it uses the plan's memory estimate and the builders' LoRA-target resolution, as a run does
FORBIDDEN["serve"] = ("rlvr.eval", "rlvr.cli", "rlvr.demo") + tuple(
    f"rlvr.orchestration.{name}" for name in ("loop", "run_state", "engine_supervisor", "evaluation", "rehearsal",
                                              "ray_actors", "ray_placement")
)
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


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in SRC.rglob("*.py")}


def rlvr_imports(name: str, path: Path) -> set[str]:
    """The rlvr modules `name` imports, at module level or inside a function. `from pkg import sub`
    is an edge to the submodule only: that the package's __init__ runs first is true of every
    submodule import, and no circle of this file's making."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & MODULES.keys()
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(base)
    return {module for module in found if module in MODULES and module != name}


def circles_inside_packages() -> set[frozenset[str]]:
    """Groups of modules that import one another, directly or through others, counting only imports
    between modules of the same package (rlvr.envs.base -> rlvr.envs.builtin counts; an import
    into another package does not)."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph = {name: {m for m in rlvr_imports(name, path) if package(m) == package(name)} for name, path in MODULES.items()}

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for module in graph[todo.pop()] - seen:
                seen.add(module)
                todo.append(module)
        return seen

    reach = {name: reachable(name) for name in graph}
    return {frozenset({name} | {other for other in reach[name] if name in reach[other]})
            for name in graph if name in reach[name]}


# Circles that exist today, each to be removed by its owner (then removed here: the test fails
# while a listed circle is gone, so the list never goes stale). checkpoint imports skeleton inside
# three functions; skeleton imports checkpoint's format readers at module level.
KNOWN_CIRCLES = {frozenset({"rlvr.quant.checkpoint", "rlvr.quant.skeleton"})}


def test_no_import_circle_inside_a_package():
    assert circles_inside_packages() == KNOWN_CIRCLES
