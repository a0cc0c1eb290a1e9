"""Where rlvr keeps what it measured or fetched once per machine: $XDG_CACHE_HOME (default ~/.cache)/rlvr."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlvr"
