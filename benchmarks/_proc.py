"""A process's memory as Linux counts it (/proc/PID/status), and which of a run's processes
is what: read one way by every benchmark that measures memory.

RssAnon is a process's private memory (what its own allocations hold; mapped files and shared
pages are not in it); VmHWM the peak of its resident set. Not `ru_maxrss`: Linux carries that
across fork + exec, so a child would report its parent's peak."""

from __future__ import annotations

from pathlib import Path

from rlvr.process_names import RANK_PREFIX, SCORER


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


def role(process) -> str:
    """What one of a run's processes is, by the name rlvr's workers give themselves
    (rlvr.process_names): "trainer rank", "scoring worker" or "other" (the controller, the ranks'
    fork server, multiprocessing's resource tracker)."""
    name = process.name()
    if name.startswith(RANK_PREFIX):
        return "trainer rank"
    return "scoring worker" if name == SCORER else "other"


def trainer_ranks(pid: int) -> list[int]:
    """The trainer ranks among `pid`'s descendants (forked from its fork server, they are not its
    own children); sorted pids."""
    import psutil

    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    ranks = []
    for process in descendants:
        try:
            if role(process) == "trainer rank":
                ranks.append(process.pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(ranks)
