"""The config tree, documented from its own field descriptions: docs/config.md and
`rlvr config --defaults` are both generated here, so neither can drift from rlvr.config.

    python -m rlvr.config_docs > docs/config.md      # tests/test_config_docs.py fails when it is stale
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from rlvr.config import RunConfig, Section, ServeConfig


def sections(model: type[BaseModel] = RunConfig, path: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(dotted path, section class) of every section of the tree, depth first, the root as ""."""
    yield path, model
    for name, field in model.model_fields.items():
        sub = section_type(field)
        if sub is not None:
            yield from sections(sub, f"{path}{name}.")


def section_type(field: FieldInfo) -> type[BaseModel] | None:
    annotation = field.annotation
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def undocumented() -> list[str]:
    """Dotted keys whose field has no description (the config's rule: none may lack one)."""
    return [
        f"{path}{name}"
        for path, model in sections()
        for name, field in model.model_fields.items()
        if not field.description
    ]


def reference_markdown() -> str:
    """docs/config.md: one table per section, every key with its type, default and description."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `rlvr/config.py` by `python -m rlvr.config_docs > docs/config.md` (a test fails when this",
        "file is stale). `rlvr config --defaults` prints the same tree as YAML. A run's config is a YAML file",
        "plus dotted overrides on the command line (`rlvr train CFG trainer.lr=1e-5 steps=50`); an unknown key",
        "or a bad value stops it before anything starts, in one line naming the key.",
    ]
    for path, model in sections():
        lines += _table_head(f"## `{path.rstrip('.') or 'top level'}`", model)
        for name, field in model.model_fields.items():
            shown = _default(field)
            if section_type(field) is not None:
                shown = "`null`, section below" if shown == "`null`" else "section below"
            lines.append(f"| `{name}` | {_type(field.annotation)} | {shown} | {field.description} |")
    lines += _table_head("## `rlvr serve` (serve.yaml)", ServeConfig)
    run_sections = {model for _, model in sections()}
    own = []  # the server's own sections (tenants, limits), documented after its table
    for name, field in ServeConfig.model_fields.items():
        sub = section_type(field)
        if sub is None:
            shown = _default(field)
        elif sub in run_sections:
            shown = f"the run's `{name}` section, above"
        else:
            entry = ".NAME" if typing.get_origin(field.annotation) is dict else ""
            shown = "section below"
            own.append((f"{name}{entry}", sub))
        lines.append(f"| `{name}` | {_type(field.annotation)} | {shown} | {field.description} |")
    for path, model in own:
        lines += _table_head(f"### `serve: {path}`", model)
        for name, field in model.model_fields.items():
            shown = "the server's `limits`" if section_type(field) is not None else _default(field)
            lines.append(f"| `{name}` | {_type(field.annotation)} | {shown} | {field.description} |")
    return "\n".join(lines) + "\n"


def _table_head(title: str, model: type[BaseModel]) -> list[str]:
    return ["", title, "", _doc(model), "", "| key | type | default | description |", "|---|---|---|---|"]


def defaults_yaml() -> str:
    """The whole tree as YAML, each key with its default and its description as a comment;
    required keys are null and say so. Optional sections (null by default) are shown filled."""
    return "\n".join(_yaml_lines(RunConfig, indent=0)) + "\n"


def _yaml_lines(model: type[BaseModel], indent: int) -> list[str]:
    pad = "  " * indent
    lines = []
    for name, field in model.model_fields.items():
        sub = section_type(field)
        note = ("REQUIRED: " if field.is_required() else "") + (field.description or "")
        if sub is not None:
            null = "" if field.is_required() or field.get_default() is not None else " (null by default: omit for none)"
            lines.append(f"{pad}{name}:  # {note}{null}")
            lines += _yaml_lines(sub, indent + 1)
            continue
        value = None if field.is_required() else _plain(field.get_default())
        text = yaml.safe_dump({name: value}, default_flow_style=True, width=10_000).strip()[1:-1]
        lines.append(f"{pad}{text}  # {note}")
    return lines


def _plain(value):
    return json.loads(json.dumps(value.model_dump(mode="json") if isinstance(value, BaseModel) else value))


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    default = field.get_default()
    if default is PydanticUndefined:
        return "**required**"
    return f"`{json.dumps(_plain(default))}`"


def _type(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in typing.get_args(annotation))
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        inner = ", ".join(_type(a) for a in args if a is not Ellipsis)
        return f"{origin.__name__}[{inner}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


if __name__ == "__main__":
    print(reference_markdown(), end="")
