"""Reading a config: YAML plus dotted overrides, checked key by key, and writing it back."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from rlvr.config.base import ConfigError, Section
from rlvr.config.run import RunConfig


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = (), schema: type[Section] = RunConfig):
    """Read a YAML config of `schema`, apply `a.b.c=value` overrides, validate; raise ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(raw).__name__}")
    for item in overrides:
        alone: dict = {}
        _apply_override(alone, item)
        _check_keys(alone, schema, prefix="", source=f"override {item!r}")
        _apply_override(raw, item)
    return validate_config(raw, source=str(path), schema=schema)


def config_to_run(config: str | None, overrides: list[str], resume: str | None) -> RunConfig:
    """What `rlvr train` runs: CONFIG with its overrides; resuming a RUN_DIR (`resume`; "latest": the
    config's own run_dir) without a CONFIG file, the run's own config.yaml (the first argument, if
    any, is then an override too)."""
    if resume in (None, "latest"):
        if config is None:
            raise ConfigError("give CONFIG (or --resume RUN_DIR to continue a run from its own config.yaml)")
        return load_config(Path(config), overrides)
    run_dir = Path(resume)
    if config is not None and "=" not in config:
        return load_config(Path(config), [*overrides, f"run_dir={resume}"])
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume {resume}: not a run folder (no config.yaml)")
    return load_config(run_dir / "config.yaml", [*([config] if config else []), *overrides, f"run_dir={resume}"])


def validate_config(raw: dict, source: str = "<config>", schema: type[Section] = RunConfig):
    _check_keys(raw, schema, prefix="", source=source)
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        if not first["loc"]:  # a rule across sections: its message names the keys
            raise ConfigError(f"{source}: {message}") from None
        key = ".".join(str(p) for p in first["loc"])
        value = _MISSING if _hides_input(schema, first["loc"]) else _lookup(raw, first["loc"])
        shown = f" (got {value!r})" if value is not _MISSING else ""
        raise ConfigError(f"{source}: {key}: {message}{shown}") from None


def _apply_override(raw: dict, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. trainer.lr=1e-5")
    set_dotted(raw, key, yaml.safe_load(text) if text else None, source=f"override {item!r}")


def set_dotted(raw: dict, key: str, value: Any, source: str = "<config>") -> None:
    """Set `a.b.c` in a raw (unvalidated) config mapping, creating sections on the way."""
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _check_keys(raw: Any, model: type[BaseModel], prefix: str, source: str) -> None:
    """Reject unknown keys, recursively, naming the closest valid one."""
    if not isinstance(raw, dict):
        return
    fields = model.model_fields
    for key, value in raw.items():
        if key not in fields:
            full = f"{prefix}{key}"
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"{source}: unknown key {full!r}{hint}")
        annotation = fields[key].annotation
        sub = _section_type(annotation)
        if sub is not None and get_origin(annotation) is dict:  # name -> section: each value is one
            for name, item in (value if isinstance(value, dict) else {}).items():
                _check_keys(item, sub, prefix=f"{prefix}{key}.{name}.", source=source)
        elif sub is not None:
            _check_keys(value, sub, prefix=f"{prefix}{key}.", source=source)


def _hides_input(model: type[BaseModel], loc: tuple) -> bool:
    """Whether a section below the root on the way to `loc` keeps its values out of errors (one
    holding secrets). The root is not asked: it hides inputs from pydantic's own message if any
    section of it does, since pydantic renders nested errors with the root's config."""
    parts = list(loc)
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        sub = _section_type(field.annotation) if field else None
        if sub is None:
            return False
        if get_origin(field.annotation) is dict and parts:
            parts.pop(0)  # the entry's name
        if sub.model_config.get("hide_input_in_errors"):
            return True
        model = sub
    return False


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


_MISSING = object()


def _lookup(raw: Any, loc: tuple) -> Any:
    node = raw
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return _MISSING
    return node


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
