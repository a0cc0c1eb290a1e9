"""The sandboxed pool: order, per-row verifiers, timeouts, crashes, memory, adversarial text.

One pool serves the module: worker start-up (sympy imports and warm-up) is the slow part.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from rlvr.rewards import ScoringPool, batched_reward

# wall-clock bounds (a timeout kills in time): run alone (conftest.py)
pytestmark = pytest.mark.solo

TIMEOUT_S = 1.0
MARKER = Path("/tmp/rlvr_pwned_marker")


def hang_in_c(response, answer):
    """Sleep with SIGALRM blocked: only the parent's kill can stop this."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)


def spin(response, answer):
    while True:
        pass


def crash(response, answer):
    os._exit(3)


def spawn_and_hang(response, answer):
    """Start a long-lived child process, then hang with SIGALRM blocked: the kill must take both."""
    child = subprocess.Popen(["sleep", "300"])
    Path(answer).write_text(str(child.pid))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)


def pid_then_sleep(response, answer):
    """Report this worker's pid (appended to the file `answer`), then take a while."""
    with open(answer, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)
    return 1.0


def hog_memory(response, answer):
    return len(bytearray(8 * 1024**3))


@batched_reward
def batch_len(responses, answers):
    return [float(len(r)) for r in responses]


def custom(name):
    return f"{__file__}:{name}"


@pytest.fixture(scope="module")
def pool():
    with ScoringPool("math", workers=2, timeout_s=TIMEOUT_S) as p:
        p.wait_ready()
        yield p


def test_order_and_per_row_verifiers(pool):
    responses = [f"\\boxed{{{i}}}" for i in range(50)] + ["#### 7", "\\boxed{Paris}"]
    answers = [str(i if i % 3 else i + 1) for i in range(50)] + ["7", "Paris"]
    verifiers = ["math"] * 50 + ["gsm8k", "exact"]
    scores = pool.score(responses, answers, verifiers)
    assert [s.reward for s in scores[:50]] == [float(i % 3 != 0) for i in range(50)]
    assert [s.extracted for s in scores[:50]] == [str(i) for i in range(50)]
    assert [s.reward for s in scores[50:]] == [1.0, 1.0]


def test_empty_batch_and_length_mismatch(pool):
    assert pool.score([], []) == []
    with pytest.raises(ValueError, match="same length"):
        pool.score(["a"], [])


@pytest.mark.parametrize(
    "name, status", [("hang_in_c", "timeout"), ("spin", "timeout"), ("crash", "error"), ("hog_memory", "error")]
)
def test_bad_item_is_contained_and_the_rest_go_on(pool, name, status):
    pool.wait_ready()  # replacing the last test's killed worker takes a start-up
    started = time.monotonic()
    scores = pool.score(["\\boxed{2}", "x", "\\boxed{3}"], ["2", "x", "3"], ["math", custom(name), "math"])
    assert time.monotonic() - started < TIMEOUT_S + 3
    assert [(s.reward, s.status) for s in scores] == [(1.0, "ok"), (0.0, status), (1.0, "ok")]


def test_batched_custom_reward(pool):
    scores = pool.score(["ab", "abc"], ["", ""], [custom("batch_len")] * 2)
    assert [s.reward for s in scores] == [2.0, 3.0]


def test_bad_item_is_timed_and_its_worker_counted(pool):
    pool.wait_ready()
    restarts = pool.restarts
    scores = pool.score(["\\boxed{2}", "x"], ["2", "x"], ["math", custom("hang_in_c")])
    assert [s.status for s in scores] == ["ok", "timeout"]
    assert pool.restarts == restarts + 1
    assert len(pool.item_seconds) == 2 and pool.item_seconds[1] >= TIMEOUT_S


def test_a_killed_worker_takes_the_processes_it_started(pool, tmp_path):
    pool.wait_ready()
    pid_file = tmp_path / "child.pid"
    (score,) = pool.score(["x"], [str(pid_file)], [custom("spawn_and_hang")])
    assert score.status == "timeout"
    pid = int(pid_file.read_text())
    for _ in range(50):  # a killed orphan lingers as a zombie until it is reaped
        if not running(pid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"child {pid} outlived its killed worker")


def test_a_worker_killed_from_outside_is_replaced_and_its_item_retried_once_each_death_one_line(tmp_path):
    lines = []
    with ScoringPool("math", workers=1, timeout_s=5.0, log=lines.append) as pool:
        pool.wait_ready()
        idle = pool._workers[0].process
        assert psutil.Process(idle.pid).name() == "rlvr-scorer"  # what ps, top and the chaos benchmark see
        os.kill(idle.pid, signal.SIGKILL)
        idle.join()
        assert [(s.reward, s.status) for s in pool.score(["\\boxed{2}"], ["2"])] == [(1.0, "ok")]
        assert lines == [f"scoring worker (pid {idle.pid}) died (exit code -9) while idle; replaced"]

        pids = tmp_path / "pids"
        killer = threading.Thread(target=_kill_first_reporter, args=(pids,))
        killer.start()
        scores = pool.score(["x", "\\boxed{3}"], [str(pids), "3"], [custom("pid_then_sleep"), "math"])
        killer.join()
        first, second = (int(pid) for pid in pids.read_text().split())
        assert first != second  # the item ran again, on the replacement
        assert [(s.reward, s.status) for s in scores] == [(1.0, "ok"), (1.0, "ok")]
        assert lines[1:] == [
            f"scoring worker (pid {first}) died (exit code -9) scoring item 0; replaced, the item is retried"
        ]

        lines.clear()  # a worker that dies on the item's retry too: the item is the response's fault
        scores = pool.score(["x", "\\boxed{3}"], ["x", "3"], [custom("crash"), "math"])
        assert [(s.reward, s.status) for s in scores] == [(0.0, "error"), (1.0, "ok")]
        assert [line.split(") died (")[1] for line in lines] == [
            "exit code 3) scoring item 0; replaced, the item is retried",
            "exit code 3) retrying item 0; the item scores status 'error'",
        ]


def _kill_first_reporter(pids: Path) -> None:
    for _ in range(300):
        if pids.exists() and pids.read_text().endswith("\n"):
            os.kill(int(pids.read_text().split()[0]), signal.SIGKILL)
            return
        time.sleep(0.01)


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_options_reach_the_default_verifier_and_bad_ones_fail_first():
    from rlvr.config import load_config

    demo = Path(__file__).parents[1] / "configs" / "demo.yaml"
    bad = load_config(demo, ["reward.options.colour=red"]).reward
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        ScoringPool(bad.verifier, options=bad.options)
    reward = load_config(demo, ["reward.verifier=math", "reward.options.extract=[boxed,answer,last_number]"]).reward
    with ScoringPool(reward.verifier, workers=1, options=reward.options) as p:
        assert p.score(["The answer is 5.", "\\boxed{28 pct}"], ["5", "28\\%"], ["math", "math"])[0].reward == 1.0
        assert p.score(["The answer is 5."], ["5"], ["gsm8k"])[0].reward == 1.0  # rows naming a verifier get no options


ADVERSARIAL = {
    "nested_braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "unclosed_braces": "\\boxed{" + "{" * 10_000,
    "one_megabyte": ("Let us think. " * 75_000)[:1_000_000] + "\\boxed{5}",
    "megabyte_of_boxes": "\\boxed{1}" * 110_000,
    "power_tower": "\\boxed{10^{10^{10^{10}}}}",
    "power_tower_bare": "so $10^{10^{10^{10}}}$ is the answer \\boxed{10^{10}^{10}^{10}}",
    "huge_factorial": "\\boxed{99999999!}",
    "python_injection": f"\\boxed{{__import__('os').system('touch {MARKER}')}}",
    "sympify_injection": f"\\boxed{{eval(\"open('{MARKER}','w')\")}}",
    "latex_input": "\\boxed{\\input{/etc/passwd}}",
    "past_int_digit_limit": "\\boxed{" + "7" * 6000 + "}",
    "deep_groups": "\\boxed{" + "{" * 11 + "\\frac{1}{2}" + "}" * 11 + "}",
}


def test_adversarial_inputs_return_in_time_without_side_effects(pool):
    MARKER.unlink(missing_ok=True)
    for name, text in ADVERSARIAL.items():
        pool.wait_ready()
        started = time.monotonic()
        (score,) = pool.score([text], ["5"])
        assert time.monotonic() - started < TIMEOUT_S + 2, name
        assert score.status in ("ok", "no_answer", "timeout"), (name, score)
    assert not MARKER.exists()
    assert pool.score(["\\boxed{5}"], ["5"])[0].reward == 1.0  # the pool still works


def test_workers_do_not_import_torch():
    probe = "import sys, rlvr.records; print('torch' in sys.modules)"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "True":
        pytest.skip("rlvr.records imports torch at module level; workers inherit it until that import is lazy")
    probe = "import sys, rlvr.rewards.verifiers; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"
