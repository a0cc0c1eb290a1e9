"""Every config key is documented, and the generated reference is what the tree says."""

import subprocess
import sys
from pathlib import Path

import yaml

from rlvr.config import RunConfig, validate_config
from rlvr.config_docs import defaults_yaml, reference_markdown, section_type, sections, undocumented

DOCS = Path(__file__).parents[1] / "docs" / "config.md"


def test_every_field_has_a_description():
    assert undocumented() == []


def test_docs_config_md_is_generated_from_the_tree():
    assert DOCS.read_text() == reference_markdown(), (
        "docs/config.md is stale: python -m rlvr.config_docs > docs/config.md"
    )
    for path, model in sections():
        assert f"## `{path.rstrip('.') or 'top level'}`" in DOCS.read_text()
        for name in model.model_fields:
            assert f"| `{name}` |" in DOCS.read_text()


def test_defaults_yaml_validates_to_the_defaults_once_the_required_keys_are_given():
    raw = yaml.safe_load(defaults_yaml())
    for path, model in sections():  # optional sections (null by default) are shown filled: drop them
        node = raw
        for part in filter(None, path.split(".")):
            node = node.get(part) if isinstance(node, dict) else None
        for name, field in model.model_fields.items():
            if (
                isinstance(node, dict)
                and section_type(field) is not None
                and not field.is_required()
                and field.default is None
            ):
                node.pop(name, None)
    raw["model"]["path"] = "m"
    raw["data"]["train"] = "t"
    assert validate_config(raw) == RunConfig(model={"path": "m"}, data={"train": "t"})


def test_rlvr_config_defaults_prints_the_documented_tree():
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "config", "--defaults"], capture_output=True, text=True, check=True
    )
    assert out.stdout == defaults_yaml()
