"""What rlvr's worker processes are called in ps, top and psutil: `rlvr-rank0`, `rlvr-scorer`.

A trainer rank is forked from a fork server, so its command line is the server's; the name is
what tells a rank from the server, from a scoring worker and from vLLM's engine core (which
names itself VLLM::EngineCore) when a person or a benchmark looks at a run's processes."""

from __future__ import annotations

from pathlib import Path

RANK_PREFIX = "rlvr-rank"
SCORER = "rlvr-scorer"


def rank_name(rank: int) -> str:
    return f"{RANK_PREFIX}{rank}"


def name_process(name: str) -> None:
    """This process's name (Linux keeps 15 bytes of it, in /proc/self/comm); elsewhere, nothing."""
    try:
        Path("/proc/self/comm").write_text(name[:15])
    except OSError:
        pass
