"""The base of every config section, and the error a config that cannot run raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming key and file."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
