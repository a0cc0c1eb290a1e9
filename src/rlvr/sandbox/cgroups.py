"""One cgroup v1 group per sandbox run, in each of the memory, pids, cpu and cpuacct hierarchies.

Rules:
- The hierarchies are found from /proc/self/mountinfo (cgroup v1 mounts and the controllers
  each carries) and /proc/self/cgroup (where this process sits in each). A run's groups are
  children of this process's own groups, so any limit set above this process still applies.
- A group is named `rlvr-sbx-<pid>-<n>` after the process that made it: groups left by a dead
  process (killed before it could clean up) are emptied and removed by `remove_stale`.
- Limits: `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap accounting
  exists, so swap is no way around it), `pids.max`, `cpu.cfs_quota_us` over `cpu.cfs_period_us`.
  cpuacct measures the CPU time of the whole tree, killed processes included (a wait4 on
  bubblewrap does not see past its PID-namespace init).
- Where cpu and cpuacct share a mount (`cpu,cpuacct`), one directory serves both.
- The runner's first process joins the groups by writing its pid to each `cgroup.procs`
  before it execs anything else, so every descendant is in them from its fork on, and a
  program cannot leave them: the sandbox has no cgroup file system mounted.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
_PREFIX = "rlvr-sbx-"
_STALE = re.compile(rf"{_PREFIX}(\d+)-\d+")


def parse_mountinfo(text: str) -> dict[str, tuple[str, Path]]:
    """{controller: (root of the mount inside its hierarchy, mount point)} of cgroup v1 mounts.

    A mountinfo line is `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS] - FSTYPE SOURCE SUPEROPTIONS`
    (proc(5)); a v1 mount's super options name its controllers (`rw,memory`, `rw,cpu,cpuacct`)."""
    found: dict[str, tuple[str, Path]] = {}
    for line in text.splitlines():
        fields, sep, tail = line.partition(" - ")
        parts, rest = fields.split(), tail.split()
        if not sep or len(parts) < 5 or len(rest) < 3 or rest[0] != "cgroup":
            continue
        for option in rest[2].split(","):
            if option in CONTROLLERS:
                found.setdefault(option, (parts[3], Path(parts[4])))
    return found


def parse_self_cgroup(text: str) -> dict[str, str]:
    """{controller: path of this process's group} from /proc/self/cgroup (`ID:CONTROLLERS:PATH` lines)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def own_groups() -> tuple[dict[str, Path], list[str]]:
    """({controller: this process's group directory, where it is writable}, [controllers missing])."""
    try:
        mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        paths = parse_self_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError:
        return {}, list(CONTROLLERS)
    groups, missing = {}, []
    for controller in CONTROLLERS:
        if controller not in mounts or controller not in paths:
            missing.append(controller)
            continue
        root, mount_point = mounts[controller]
        inside = paths[controller]
        relative = inside[len(root) :] if inside.startswith(root) else inside
        directory = mount_point / relative.lstrip("/")
        if directory.is_dir() and os.access(directory, os.W_OK):
            groups[controller] = directory
        else:
            missing.append(controller)
    return groups, missing


def _kill_members(directory: Path) -> bool:
    """SIGKILL every process in the group; True when it was already empty."""
    try:
        pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return True
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return not pids


class RunGroups:
    """The memory, pids and cpu groups of one run (rules in the module doc)."""

    def __init__(
        self, parents: dict[str, Path], name: str, *, memory_bytes: int, max_processes: int, cpus: float
    ) -> None:
        self.dirs = {controller: parent / name for controller, parent in parents.items()}
        try:
            for directory in self.unique_dirs:
                directory.mkdir()
            memory = self.dirs["memory"]
            (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():
                (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (self.dirs["pids"] / "pids.max").write_text(str(max_processes))
            period = int((self.dirs["cpu"] / "cpu.cfs_period_us").read_text())
            (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * period))))
        except BaseException:
            self.remove()
            raise

    @property
    def unique_dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    @property
    def procs_files(self) -> list[Path]:
        return [directory / "cgroup.procs" for directory in self.unique_dirs]

    def cpu_seconds(self) -> float:
        """CPU time of every process that was in the group."""
        return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9

    def memory_kills(self) -> int:
        """Processes the kernel's OOM killer ended at this group's memory limit."""
        for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def process_limit_hits(self) -> int:
        """Forks refused at `pids.max`."""
        return int((self.dirs["pids"] / "pids.events").read_text().split()[1])

    def kill(self, timeout_s: float = 5.0) -> None:
        """SIGKILL whatever is in the groups until they are empty (or `timeout_s` passed)."""
        deadline = time.monotonic() + timeout_s
        for directory in self.unique_dirs:
            while not _kill_members(directory) and time.monotonic() < deadline:
                time.sleep(0.001)

    def remove(self) -> None:
        """Kill whatever is still in the groups, then delete them."""
        self.kill()
        for directory in self.unique_dirs:
            try:
                directory.rmdir()
            except OSError:
                # gone already, or a process in uninterruptible sleep outlasted the deadline:
                # then the group is left for remove_stale, which knows it by this process's pid
                pass


def remove_stale(parents: dict[str, Path]) -> int:
    """Empty and delete groups whose creating process is gone; returns how many."""
    removed = 0
    for parent in set(parents.values()):
        for directory in parent.glob(f"{_PREFIX}*"):
            match = _STALE.fullmatch(directory.name)
            if not match or _alive(int(match.group(1))):
                continue
            for _ in range(1000):
                if _kill_members(directory):
                    break
                time.sleep(0.001)
            try:
                directory.rmdir()
                removed += 1
            except OSError:
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_name(pid: int, n: int) -> str:
    return f"{_PREFIX}{pid}-{n}"
