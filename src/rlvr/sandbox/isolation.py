"""What isolation this machine gives a sandboxed program, and the command line that applies it.

Layers, outermost first (each one `exec`s the next, so they are one process until Python starts):
1. `sh` writes its own pid into the run's cgroups (memory, pids, cpu; see `cgroups.py`), so the
   whole tree is counted and limited from the first fork on.
2. `prlimit` (util-linux) sets RLIMIT_CPU (SIGXCPU at the limit, SIGKILL a second later),
   RLIMIT_FSIZE, no core files, and RLIMIT_AS: unlimited where the memory cgroup limits the
   tree, the memory limit per process where it cannot. A lower hard limit of rlvr's own
   process stays (raising one needs CAP_SYS_RESOURCE).
3. `setpriv` (util-linux, only when rlvr runs as root) drops to `config.uid` with no
   supplementary groups and no_new_privs: the program is nobody on the host, whatever its
   user namespace says.
4. `bwrap` (bubblewrap) gives new user, PID, network, IPC, UTS and cgroup namespaces (no
   network but a loopback of its own; only its own processes visible; PID 1 a reaper whose
   exit kills every process left), no capabilities, no further user namespaces, a new session,
   death with its parent, an empty environment but PATH/HOME/TMPDIR/LANG, and a file system of
   read-only binds (/usr, the merged-/usr links, the interpreter's prefixes,
   `read_only_paths`), a fresh /proc and /dev, and a size-capped private tmpfs on /tmp, its
   working directory. The root is remounted read-only.
5. `python -I -B -c <_boot.py>` unpacks the run's files and runs `main.py`.

`isolation=strict` needs all of it and refuses in one line (`SandboxUnavailable`) otherwise;
`isolation=weak` uses what there is and names what is missing (`Plan.isolation`), with
these fallbacks: no bubblewrap, a host temp dir as working directory (the program sees the
host's files and network); no cgroups, RLIMIT_AS for memory and no limit on processes or CPU
share.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from rlvr.config import SandboxConfig
from rlvr.sandbox import cgroups

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
RESULT_FD_VAR = "RLVR_RESULT_FD"
BOOT = (resources.files("rlvr.sandbox") / "_boot.py").read_text()
_SH_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done; exec "$@"'


class SandboxUnavailable(RuntimeError):
    """The isolation asked for cannot be had here; the message is one line saying why and what to do."""


@dataclass(frozen=True)
class Plan:
    """How runs are isolated on this machine (rules in the module doc)."""

    config: SandboxConfig
    python: str
    python_prefixes: tuple[str, ...]  # host folders the interpreter needs, outside /usr
    prlimit: str
    setpriv: str | None  # None: not root, the program keeps rlvr's user
    bwrap: str | None  # None: no namespaces (weak)
    cgroup_parents: dict[str, Path]  # empty: no cgroups (weak)
    rlimits: tuple[str, ...]  # prlimit's options
    missing: tuple[str, ...] = ()  # what weak mode lacks, in words

    @property
    def isolation(self) -> str:
        return "strict" if not self.missing else "weak: " + "; ".join(self.missing)

    def without_namespaces(self, reason: str) -> Plan:
        return replace(
            self,
            bwrap=None,
            missing=(
                *self.missing,
                f"no namespaces ({reason}): the program sees the host's files, network and processes",
            ),
        )

    def environment(self, home: str, result_fd: int) -> dict[str, str]:
        return {"PATH": SANDBOX_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", RESULT_FD_VAR: str(result_fd)}

    def command(self, procs_files: list[Path], result_fd: int) -> list[str]:
        """The argv of one run whose first process joins the cgroups behind `procs_files`."""
        argv = [self.prlimit, *self.rlimits, "--"]
        if self.setpriv:
            uid = str(self.config.uid)
            argv += [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
        if self.bwrap:
            argv += self._bwrap_args(result_fd)
        argv += [self.python, "-I", "-B", "-c", BOOT]
        if procs_files:
            argv = ["/bin/sh", "-c", _SH_JOIN, "sh", str(len(procs_files)), *map(str, procs_files), *argv]
        return argv

    def _bwrap_args(self, result_fd: int) -> list[str]:
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
        args += ["--cap-drop", "ALL", "--hostname", "sandbox", "--clearenv"]
        for key, value in self.environment("/tmp", result_fd).items():
            args += ["--setenv", key, value]
        args += ["--ro-bind", "/usr", "/usr"]
        for name in MERGED_USR:
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                args += ["--ro-bind", str(host), str(host)]
        for path in (*self.python_prefixes, *self.config.read_only_paths):
            args += ["--ro-bind", path, path]
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(self.config.tmp_mb << 20), "--tmpfs", "/tmp"]
        args += ["--remount-ro", "/", "--chdir", "/tmp"]
        return args


def _tool(name: str) -> str:
    path = shutil.which(name, path=SYSTEM_PATH)
    if path is None:
        raise SandboxUnavailable(f"sandbox: {name} (util-linux) not found on {SYSTEM_PATH}")
    return path


def _interpreter(python: str) -> tuple[str, tuple[str, ...]]:
    """The interpreter's path and the host folders outside /usr it needs (its prefixes)."""
    path = python if "/" in python else shutil.which(python, path=SANDBOX_PATH)
    if path is None or not os.access(path, os.X_OK):
        raise SandboxUnavailable(f"sandbox: python interpreter {python!r} not found (sandbox.python)")
    probe = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, list(sys.version_info[:2])]))"
    try:
        out = subprocess.run(
            [path, "-I", "-c", probe], capture_output=True, text=True, timeout=60, env={"PATH": SYSTEM_PATH}, check=True
        )
        prefix, base_prefix, version = json.loads(out.stdout)
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        raise SandboxUnavailable(f"sandbox: python interpreter {path} does not run ({e})") from None
    if tuple(version) < (3, 9):
        raise SandboxUnavailable(
            f"sandbox: python interpreter {path} is Python {version[0]}.{version[1]}; 3.9 or newer is needed"
        )
    folders = {prefix, base_prefix, str(Path(os.path.realpath(path)).parent)}
    outside = sorted(f for f in folders if not (f == "/usr" or f.startswith("/usr/")))
    # a folder inside another is already bound with it
    return path, tuple(f for f in outside if not any(f.startswith(o + "/") for o in outside if o != f))


def make_plan(config: SandboxConfig) -> Plan:
    """The plan for `config` on this machine, or SandboxUnavailable (strict, something missing)."""
    if not Path("/proc/self/mountinfo").exists():
        raise SandboxUnavailable("sandbox: needs Linux (namespaces, cgroups, /proc)")
    for path in config.read_only_paths:
        if not Path(path).is_absolute() or not Path(path).exists():
            raise SandboxUnavailable(f"sandbox.read_only_paths: {path!r} is not an existing absolute path")
    python, prefixes = _interpreter(config.python)
    missing = []
    bwrap = config.bwrap if "/" in config.bwrap else shutil.which(config.bwrap, path=SYSTEM_PATH)
    if bwrap is None or not os.access(bwrap, os.X_OK):
        missing.append(
            f"no namespaces (bubblewrap {config.bwrap!r} not found): the program sees the host's files, network and processes"
        )
        bwrap = None
    parents, absent = cgroups.own_groups() if os.geteuid() == 0 else ({}, list(cgroups.CONTROLLERS))
    if absent:
        missing.append(
            f"no cgroups (v1 {', '.join(absent)} not writable): memory limited per process, process count and CPU share unlimited"
        )
        parents = {}
    if missing and config.isolation == "strict":
        fix = (
            "install bubblewrap (make setup: apt-get install bubblewrap)"
            if bwrap is None
            else "run as root on a machine with cgroup v1 memory, pids and cpu"
        )
        raise SandboxUnavailable(
            f"sandbox: refusing to run untrusted code: {missing[0].split(':')[0]}; {fix}, or set sandbox isolation=weak"
        )
    return Plan(
        config=config,
        python=python,
        python_prefixes=prefixes,
        prlimit=_tool("prlimit"),
        setpriv=_tool("setpriv") if os.geteuid() == 0 else None,
        bwrap=bwrap,
        cgroup_parents=parents,
        rlimits=_rlimits(config, with_cgroups=bool(parents)),
        missing=tuple(missing),
    )


def _rlimits(config: SandboxConfig, with_cgroups: bool) -> tuple[str, ...]:
    """prlimit's options, each within this process's hard limit: raising one needs
    CAP_SYS_RESOURCE, which even root may lack (containers), and a scoring worker's own
    RLIMIT_AS is inherited by the sandboxes it starts."""

    def fit(which: int, value: int) -> str:
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY and (value == resource.RLIM_INFINITY or value > hard):
            value = hard
        return "unlimited" if value == resource.RLIM_INFINITY else str(value)

    cpu = math.ceil(config.cpu_s or config.wall_s)
    address_space = resource.RLIM_INFINITY if with_cgroups else config.memory_mb << 20
    return (
        f"--cpu={fit(resource.RLIMIT_CPU, cpu)}:{fit(resource.RLIMIT_CPU, cpu + 1)}",
        f"--as={fit(resource.RLIMIT_AS, address_space)}",
        f"--fsize={fit(resource.RLIMIT_FSIZE, config.tmp_mb << 20)}",
        "--core=0",
    )
