"""A process's memory as Linux counts it (/proc/PID/status), and the processes a run spawned:
read one way by every benchmark that measures memory.

RssAnon is a process's private memory (what its own allocations hold; mapped files and shared
pages are not in it); VmHWM the peak of its resident set. Not `ru_maxrss`: Linux carries that
across fork + exec, so a child would report its parent's peak."""

from __future__ import annotations

from pathlib import Path


def status_bytes(pid: int | str = "self") -> dict[str, int]:
    """Every size line of /proc/PID/status (RssAnon, VmHWM, ...) in bytes; {} once the process is
    gone. An exited process not yet reaped has no memory lines either."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if len(fields) == 2 and fields[1] == "kB":
            values[key] = int(fields[0]) * 1024
    return values


def spawned_worker(command: str) -> bool:
    """Whether a command line is a process multiprocessing started with spawn (a trainer rank, a
    scoring worker), not its resource tracker."""
    return "spawn_main" in command and "resource_tracker" not in command


def spawned_children(pid: int) -> list[int]:
    """The children of `pid` that multiprocessing started with spawn (trainer ranks, scoring
    workers), without its resource tracker; sorted pids."""
    import psutil

    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    spawned = []
    for child in children:
        try:
            command = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if spawned_worker(command):
            spawned.append(child.pid)
    return sorted(spawned)
