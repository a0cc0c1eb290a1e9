"""What `rlvr demo` builds before it trains: the task, the tiny model, the warm start (assets),
which runs until the model is ready for RL (warm_start, skills)."""

from rlvr.demo.assets import ensure_demo_assets

__all__ = ["ensure_demo_assets"]
