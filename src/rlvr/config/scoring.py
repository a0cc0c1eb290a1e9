"""How samples are scored: the verifier's pool, and the sandbox for model-written code."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlvr.config.base import Section


class RewardConfig(Section):
    """How completions are scored: a verifier in a pool of sandboxed worker processes."""

    verifier: str = Field("math", description="math, aime, gsm8k, exact, regex, or module:function (a custom reward)")
    workers: int = Field(2, ge=1, description="scoring worker processes")
    timeout_s: float = Field(
        2.0, gt=0, description="seconds one item may take; past it the item scores 0 with status timeout"
    )
    memory_limit_mb: int = Field(1024, gt=0, description="address-space limit of each scoring worker")
    options: dict[str, Any] = Field(
        {},
        description="options for the verifier, checked when the scoring pool starts; math: extract (modes tried in "
        "order: boxed, answer, last_number, whole), reasoning_end, ignore_case, percent (either|ratio|number), "
        "decimal_comma (auto|never|always); see docs/rewards.md",
    )


class SandboxConfig(Section):
    """Limits and isolation for running untrusted programs (rlvr.sandbox, the `code` verifier)."""

    isolation: Literal["strict", "weak"] = Field(
        "strict",
        description="strict: bubblewrap namespaces (no network, own PIDs, read-only files) plus cgroup v1 "
        "memory/pids/cpu limits, else refuse; weak: run with whatever of these the machine has, "
        "naming what is missing in every result",
    )
    wall_s: float = Field(10.0, gt=0, description="wall-clock limit of one run, from start to kill")
    cpu_s: float | None = Field(None, gt=0, description="CPU-time limit of each process (RLIMIT_CPU); null: wall_s")
    memory_mb: int = Field(512, gt=0, description="memory of the whole run, files in its /tmp included (cgroup)")
    max_processes: int = Field(64, ge=4, description="processes and threads of the whole run at once (cgroup pids)")
    cpus: float = Field(1.0, gt=0, description="CPU bandwidth of the whole run, in cores (cgroup cpu quota)")
    tmp_mb: int = Field(64, gt=0, description="size of the private writable /tmp")
    max_output_bytes: int = Field(
        65536, gt=0, description="stdout and stderr kept per run, each; the rest is read and dropped"
    )
    workers: int = Field(2, ge=1, description="programs a SandboxPool runs at once")
    python: str = Field(
        "python3",
        description="interpreter inside the sandbox, found on /usr/local/bin:/usr/bin:/bin unless a path; "
        "it and its prefix must be readable by the sandbox user",
    )
    read_only_paths: list[str] = Field([], description="extra host paths the program may read (mounted read-only)")
    bwrap: str = Field("bwrap", description="the bubblewrap executable (Debian package bubblewrap)")
    uid: int = Field(65534, ge=1, description="user (and group) id the program runs as when rlvr runs as root")
