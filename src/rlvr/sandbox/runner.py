"""One sandboxed run: start the layers of `isolation.py`, feed the program, collect, enforce, clean up.

Rules:
- The program is `main.py` plus optional files, all written into its private /tmp, and
  `stdin` after them on its standard input (the framing is `_boot.py`'s). Nothing the host
  holds reaches it otherwise: no environment, no descriptors but stdin, stdout, stderr and
  the result channel (a pipe whose number is in $RLVR_RESULT_FD), no host path but the
  read-only binds.
- stdout and stderr are read as they come: the first `max_output_bytes` of each are kept,
  the rest is read and dropped (a flood costs time, not memory), and the limit is reported.
  The result channel keeps its first 64 KiB.
- At `wall_s` after the start the run is killed: SIGKILL to bubblewrap, whose sandbox init
  dies with it (PR_SET_PDEATHSIG) and takes every process of the PID namespace with it, then
  to whatever the cgroups still hold. A run that ends by itself is cleaned the same way: its
  init's exit has already ended every process left in the namespace (the double-forked
  daemon included), the cgroup sweep finds them gone, the groups and any temp dir are removed.
- Limits hit are named in `SandboxResult.limits`: "wall" and "cpu" make the status
  "timeout", "memory" (the OOM killer ended a process) makes it "error"; "processes" (a fork
  refused at max_processes) and "output" only inform.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from rlvr.config import SandboxConfig
from rlvr.sandbox import cgroups
from rlvr.sandbox.isolation import SYSTEM_PATH, SandboxUnavailable, make_plan

RESULT_BYTES = 64 * 1024
_READ_CHUNK = 1 << 20
_run_ids = itertools.count()

RunStatus = Literal["ok", "timeout", "error"]


@dataclass(frozen=True)
class SandboxResult:
    """What one run did. `exit_code` is the program's (128+N when signal N ended it; None when
    the sandbox killed it at the wall-clock limit); `isolation` is "strict" or names what the
    weak mode lacked."""

    status: RunStatus
    exit_code: int | None
    stdout: str
    stderr: str
    result: bytes
    limits: tuple[str, ...]
    wall_s: float
    cpu_s: float | None  # the whole tree's; None where it cannot be measured (weak: bubblewrap without cgroups)
    isolation: str

    @property
    def summary(self) -> str:
        """One line for logs: status, how it ended, limits hit, and a weak mode's name."""
        ended = "killed at the wall-clock limit" if self.exit_code is None else f"exit {self.exit_code}"
        cpu = "" if self.cpu_s is None else f", {self.cpu_s:.2f} s cpu"
        limits = f", limits hit: {', '.join(self.limits)}" if self.limits else ""
        weak = f" [isolation {self.isolation}]" if self.isolation != "strict" else ""
        return f"{self.status} ({ended}, {self.wall_s:.2f} s wall{cpu}{limits}){weak}"


class _Stream:
    """A pipe read as it fills, keeping the first `cap` bytes."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.kept = bytearray()
        self.dropped = 0
        os.set_blocking(fd, False)

    def read(self) -> bool:
        """Read what is there; False at end of file."""
        while True:
            try:
                chunk = os.read(self.fd, _READ_CHUNK)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            room = self.cap - len(self.kept)
            self.kept += chunk[:room]
            self.dropped += max(0, len(chunk) - room)


def _frame(files: Mapping[str, bytes]) -> bytes:
    header = json.dumps([[name, len(data)] for name, data in files.items()]).encode()
    return b"%010d" % len(header) + header + b"".join(files.values())


def _check_name(name: str) -> None:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"sandbox file name {name!r}: must be a relative path without '.' or '..' parts")


class Sandbox:
    """Runs Python programs in fresh sandboxes (rules in the module doc); `run` is thread-safe.

    Construction checks the machine (`make_plan`) and runs a probe program; either failing
    raises SandboxUnavailable with one line. In weak mode a bubblewrap that fails its probe is
    dropped, and the reason becomes part of the isolation's name."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.plan = make_plan(self.config)
        if self.plan.cgroup_parents:
            cgroups.remove_stale(self.plan.cgroup_parents)
        probe = self.run("print('ok')")
        if probe.status != "ok" or probe.stdout != "ok\n":
            reason = _first_line(probe.stderr) or probe.summary
            if self.config.isolation == "weak" and self.plan.bwrap is not None:
                self.plan = self.plan.without_namespaces(f"bubblewrap failed: {reason}")
                probe = self.run("print('ok')")
            if probe.status != "ok" or probe.stdout != "ok\n":
                raise SandboxUnavailable(
                    f"sandbox: a probe program failed to run: {_first_line(probe.stderr) or probe.summary}"
                )

    @property
    def isolation(self) -> str:
        return self.plan.isolation

    def run(self, source: str, *, stdin: bytes = b"", files: Mapping[str, str | bytes] | None = None) -> SandboxResult:
        """Run `source` as main.py with `files` beside it and `stdin` as its input."""
        payload = {"main.py": source, **(files or {})}
        for name in payload:
            _check_name(name)
        framed = _frame({k: v.encode() if isinstance(v, str) else bytes(v) for k, v in payload.items()}) + stdin
        cfg, plan = self.config, self.plan
        groups = None
        if plan.cgroup_parents:
            groups = cgroups.RunGroups(
                plan.cgroup_parents,
                cgroups.group_name(os.getpid(), next(_run_ids)),
                memory_bytes=cfg.memory_mb << 20,
                max_processes=cfg.max_processes,
                cpus=cfg.cpus,
            )
        workdir = process = None
        result_r, result_w = os.pipe()
        try:
            if plan.bwrap:
                cwd, env = "/", {"PATH": SYSTEM_PATH}
            else:
                workdir = tempfile.mkdtemp(prefix="rlvr-sbx-")
                if plan.setpriv:
                    os.chown(workdir, cfg.uid, cfg.uid)
                cwd, env = workdir, plan.environment(workdir, result_w)
            started = time.monotonic()
            process = subprocess.Popen(
                plan.command(groups.procs_files if groups else [], result_w),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(result_w,), cwd=cwd, env=env, start_new_session=True,
            )  # fmt: skip
            os.close(result_w)
            result_w = -1
            return self._supervise(process, framed, result_r, groups, started)
        finally:
            if process is not None and process.returncode is None:  # supervision itself failed
                _kill_group(process.pid)
                process.wait()
            for fd in (result_r, result_w):
                if fd >= 0:
                    os.close(fd)
            if groups is not None:
                groups.remove()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _supervise(
        self, process: subprocess.Popen, framed: bytes, result_r: int, groups: cgroups.RunGroups | None, started: float
    ) -> SandboxResult:
        cfg = self.config
        deadline = started + cfg.wall_s
        streams = {
            process.stdout.fileno(): _Stream(process.stdout.fileno(), cfg.max_output_bytes),
            process.stderr.fileno(): _Stream(process.stderr.fileno(), cfg.max_output_bytes),
            result_r: _Stream(result_r, RESULT_BYTES),
        }
        pidfd = os.pidfd_open(process.pid)
        stdin_fd = process.stdin.fileno()
        os.set_blocking(stdin_fd, False)
        pending = memoryview(framed)
        timed_out = exited = False
        with selectors.DefaultSelector() as selector:
            selector.register(pidfd, selectors.EVENT_READ)
            selector.register(stdin_fd, selectors.EVENT_WRITE)
            for fd in streams:
                selector.register(fd, selectors.EVENT_READ)
            while not exited:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                for key, _ in selector.select(remaining):
                    if key.fd == pidfd:
                        exited = True
                    elif key.fd == stdin_fd:
                        pending = _feed(stdin_fd, pending)
                        if not pending:
                            selector.unregister(stdin_fd)
                            process.stdin.close()
                    elif not streams[key.fd].read():
                        selector.unregister(key.fd)
        if not process.stdin.closed:
            process.stdin.close()
        if timed_out or not self.plan.bwrap:  # without a PID namespace, the session's leftovers die here too
            _kill_group(process.pid)
        _, status, usage = os.wait4(process.pid, 0)
        os.close(pidfd)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall_s = time.monotonic() - started
        if groups is not None:
            groups.kill()
        for stream in streams.values():  # what was written before the end
            stream.read()
        process.stdout.close()
        process.stderr.close()
        if groups is not None:
            cpu_s = groups.cpu_seconds()
        elif self.plan.bwrap:
            cpu_s = None  # wait4 does not see past bubblewrap's PID-namespace init
        else:
            cpu_s = usage.ru_utime + usage.ru_stime
        return self._result(process.returncode, timed_out, streams, result_r, groups, wall_s, cpu_s)

    def _result(
        self,
        returncode: int,
        timed_out: bool,
        streams: dict,
        result_r: int,
        groups: cgroups.RunGroups | None,
        wall_s: float,
        cpu_s: float | None,
    ) -> SandboxResult:
        cfg = self.config
        out, err = (streams[fd] for fd in streams if fd != result_r)
        exit_code = None if timed_out else (returncode if returncode >= 0 else 128 - returncode)
        limits = []
        if timed_out:
            limits.append("wall")
        memory_kills = groups.memory_kills() if groups else 0
        cpu_limit_reached = cpu_s is not None and cpu_s >= (cfg.cpu_s or cfg.wall_s)
        if exit_code == 128 + signal.SIGXCPU or (
            exit_code == 128 + signal.SIGKILL and not memory_kills and cpu_limit_reached
        ):
            limits.append("cpu")
        if memory_kills:
            limits.append("memory")
        if groups and groups.process_limit_hits():
            limits.append("processes")
        if out.dropped or err.dropped:
            limits.append("output")
        status: RunStatus = "timeout" if {"wall", "cpu"} & set(limits) else "error" if "memory" in limits else "ok"
        return SandboxResult(
            status=status,
            exit_code=exit_code,
            stdout=out.kept.decode("utf-8", "replace"),
            stderr=err.kept.decode("utf-8", "replace"),
            result=bytes(streams[result_r].kept),
            limits=tuple(limits),
            wall_s=wall_s,
            cpu_s=cpu_s,
            isolation=self.plan.isolation,
        )


def _kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads: bubblewrap's, or the program's own session without it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _feed(fd: int, pending: memoryview) -> memoryview:
    """Write what the pipe takes of `pending`; the rest, or nothing once the reader is gone."""
    try:
        return pending[os.write(fd, pending[:_READ_CHUNK]) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[:0]


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
