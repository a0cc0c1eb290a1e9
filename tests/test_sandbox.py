"""rlvr.sandbox: real runs under bubblewrap and cgroups (each ~0.1 s), limits, refusal, weak mode."""

from __future__ import annotations

import errno
import socket
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from rlvr.config import SandboxConfig
from rlvr.sandbox import Sandbox, SandboxPool, SandboxUnavailable, cgroups
from rlvr.sandbox.cgroups import parse_mountinfo, parse_self_cgroup

# wall-clock bounds (a limit kills in time) and every cgroup on the machine: run alone (conftest.py)
pytestmark = pytest.mark.solo


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(wall_s=5))


def test_strict_isolation_on_this_machine(sandbox):
    assert sandbox.isolation == "strict"


def test_program_gets_its_files_and_stdin(sandbox):
    source = "import os, sys\nprint(open('data/in.txt').read(), sys.stdin.read(), os.getcwd(), sorted(os.environ))"
    result = sandbox.run(source, stdin=b"from stdin", files={"data/in.txt": "from a file"})
    assert result.status == "ok" and result.exit_code == 0
    assert result.stdout == "from a file from stdin /tmp ['HOME', 'LANG', 'PATH', 'PWD', 'RLVR_RESULT_FD', 'TMPDIR']\n"


def test_traceback_is_the_programs_own(sandbox):
    result = sandbox.run("x = 1\nraise ValueError('boom')")
    assert result.status == "ok" and result.exit_code == 1
    assert result.stderr.startswith('Traceback (most recent call last):\n  File "/tmp/main.py", line 2')
    assert result.stderr.rstrip().endswith("ValueError: boom") and "_boot" not in result.stderr


def test_exit_code_and_result_channel(sandbox):
    result = sandbox.run("import os, sys\nos.write(int(os.environ['RLVR_RESULT_FD']), b'verdict')\nsys.exit(3)")
    assert (result.exit_code, result.result) == (3, b"verdict")


def test_bad_file_names_are_refused(sandbox):
    for name in ("../x", "/etc/x", "a/../../x", ""):
        with pytest.raises(ValueError, match="sandbox file name"):
            sandbox.run("pass", files={name: "x"})


def test_program_runs_as_nobody_in_its_own_namespaces(sandbox):
    source = "import os\nprint(os.getuid(), os.getpid(), sorted(p for p in os.listdir('/proc') if p.isdigit()), os.uname().nodename)"
    assert sandbox.run(source).stdout == "65534 2 ['1', '2'] sandbox\n"


def test_files_are_read_only_but_tmp(sandbox):
    source = (
        "import os\n"
        "for path in ('/usr/rlvr-x', '/rlvr-x', '/proc/sys/kernel/hostname'):\n"
        "    try:\n        open(path, 'w').write('x'); print('wrote', path)\n    except OSError as e:\n        print(e.errno)\n"
        "open('/tmp/ok', 'w').write('x'); print(os.listdir('/'))"
    )
    lines = sandbox.run(source).stdout.splitlines()
    assert not any(line.startswith("wrote") for line in lines)
    assert "home" not in lines[-1] and "root" not in lines[-1] and "etc" not in lines[-1]


def test_no_network(sandbox):
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.3)
        port = server.getsockname()[1]
        source = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\nexcept OSError as e:\n    print(e.errno)"
        assert sandbox.run(source).stdout == f"{errno.ECONNREFUSED}\n"  # its own loopback, where nothing listens
        with pytest.raises(TimeoutError):
            server.accept()


def test_wall_clock_limit():
    sandbox = Sandbox(SandboxConfig(wall_s=1))
    started = time.monotonic()
    result = sandbox.run(
        "import signal\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"
    )
    assert result.status == "timeout" and result.exit_code is None and "wall" in result.limits
    assert time.monotonic() - started < 2.5


def test_cpu_limit_kills_even_when_sigxcpu_is_ignored():
    sandbox = Sandbox(SandboxConfig(wall_s=20, cpu_s=1))
    result = sandbox.run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass")
    assert result.status == "timeout" and result.limits == ("cpu",) and result.exit_code == 137
    assert 1.0 <= result.cpu_s < 3.0 and result.wall_s < 10


def test_memory_limit():
    result = Sandbox(SandboxConfig(memory_mb=64)).run("x = bytearray(200 * 1024 * 1024)\nprint('survived')")
    assert result.status == "error" and "memory" in result.limits and "survived" not in result.stdout


def test_process_limit():
    source = (
        "import os, time\nborn = 0\n"
        "for _ in range(40):\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n        born += 1\n    except OSError:\n        pass\n"
        "print(born)"
    )
    result = Sandbox(SandboxConfig(max_processes=8)).run(source)
    assert result.status == "ok" and "processes" in result.limits
    assert int(result.stdout) < 8  # bubblewrap, its PID-namespace init and the program take three of the eight


def test_output_is_capped_not_buffered():
    result = Sandbox(SandboxConfig(max_output_bytes=1000)).run(
        "import sys\nfor _ in range(1000):\n    sys.stdout.write('x' * 10000)\nprint('end', file=sys.stderr)"
    )
    assert (
        result.status == "ok" and result.stdout == "x" * 1000 and result.stderr == "end\n" and "output" in result.limits
    )


def test_nothing_survives_the_run(sandbox, tmp_path):
    token = uuid.uuid4().hex
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 2; echo {token} > /tmp/marker'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)"
    )
    result = sandbox.run(daemon)
    assert result.status == "ok"
    assert not [p for p in psutil.process_iter(["cmdline"]) if token in " ".join(p.info["cmdline"] or [])]


def test_pool_runs_programs_at_once():
    with SandboxPool(SandboxConfig(workers=4)) as pool:
        started = time.monotonic()
        results = pool.map(["import time\ntime.sleep(1)\nprint('slept')"] * 4)
        elapsed = time.monotonic() - started
    assert [r.stdout for r in results] == ["slept\n"] * 4
    assert elapsed < 3.5  # one after another would take more than 4 s


def test_strict_refuses_in_one_line_without_bubblewrap():
    with pytest.raises(SandboxUnavailable) as err:
        Sandbox(SandboxConfig(bwrap="/nonexistent/bwrap"))
    message = str(err.value)
    assert "\n" not in message and "bubblewrap" in message and "isolation=weak" in message


def test_weak_mode_runs_and_names_what_is_missing(tmp_path):
    sandbox = Sandbox(SandboxConfig(bwrap="/nonexistent/bwrap", isolation="weak"))
    result = sandbox.run("import os\nprint(os.getuid())")
    assert result.stdout == "65534\n"
    assert result.isolation.startswith("weak: no namespaces") and "[isolation weak: no namespaces" in result.summary


def test_cgroup_discovery_parses_v1_and_co_mounted_controllers():
    mountinfo = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 /outer /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    mounts = parse_mountinfo(mountinfo)
    assert mounts == {
        "cpu": ("/", Path("/sys/fs/cgroup/cpu,cpuacct")),
        "cpuacct": ("/", Path("/sys/fs/cgroup/cpu,cpuacct")),
        "memory": ("/outer", Path("/sys/fs/cgroup/memory")),
    }
    assert parse_self_cgroup("4:memory:/outer/job\n2:cpu,cpuacct:/\n0::/user.slice\n") == {
        "memory": "/outer/job", "cpu": "/", "cpuacct": "/", "": "/user.slice",
    }  # fmt: skip
    assert parse_mountinfo("41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n") == {}


def test_groups_left_by_a_dead_process_are_removed(sandbox):
    parents = sandbox.plan.cgroup_parents
    gone = subprocess.Popen(["true"])
    gone.wait()
    name = cgroups.group_name(gone.pid, 0)
    for parent in set(parents.values()):
        (parent / name).mkdir()
    assert cgroups.remove_stale(parents) == len(set(parents.values()))
    assert not any((parent / name).exists() for parent in parents.values())
