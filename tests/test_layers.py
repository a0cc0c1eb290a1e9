"""Imports run one way, down the layers: the stages never reach up into what drives them."""

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "rlvr"

# The layers, top first. A module imports only from its own package and from layers below its
# own, at module level or inside a function; packages on one layer are independent of each other.
# So no import runs up, and no circle can form between packages.
LAYERS = (
    ("cli",),
    (
        "demo",
        "serve",
        "config_docs",
    ),  # front ends: the demo drives runs; the server drives the pieces a run drives, never the loop
    ("orchestration",),  # running a run: loop, builders, state, evaluation schedule, supervision, placement
    ("planning", "eval"),  # what a run will hold and take; scoring a model on held-out sets
    ("rollout", "sync"),  # generating a step's rollouts; pushing a policy to the engine and checking it arrived
    ("envs", "training", "engines", "checkpoint"),
    ("rewards", "quant", "algorithms"),
    ("sandbox", "models"),
    ("config",),
    ("data", "tracking", "hardware"),
    ("errors", "records", "cache", "process_names", "affinity"),
)
LAYER = {f"rlvr.{name}": depth for depth, names in enumerate(LAYERS) for name in names}


def owner(module: str) -> str:
    """The layer entry a module belongs to: its package (rlvr.quant.nf4 -> rlvr.quant) or itself (rlvr.cli)."""
    return ".".join(module.split(".")[:2])


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

    graph = {
        name: {m for m in rlvr_imports(name, path) if package(m) == package(name)} for name, path in MODULES.items()
    }

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for module in graph[todo.pop()] - seen:
                seen.add(module)
                todo.append(module)
        return seen

    reach = {name: reachable(name) for name in graph}
    return {
        frozenset({name} | {other for other in reach[name] if name in reach[other]})
        for name in graph
        if name in reach[name]
    }


def test_every_module_has_a_layer():
    assert sorted({owner(name) for name in MODULES} - LAYER.keys() - {"rlvr"}) == []


def test_no_import_runs_up_or_across_the_layers():
    wrong = {
        (name, imported)
        for name, path in MODULES.items()
        for imported in rlvr_imports(name, path)
        if owner(imported) != owner(name) and owner(name) in LAYER and LAYER[owner(imported)] <= LAYER[owner(name)]
    }
    assert wrong == set()


def test_no_import_circle_inside_a_package():
    assert circles_inside_packages() == set()
