"""The `code` verifier's main.py: runs inside the sandbox, never imported by rlvr.

Standard input is one JSON object: {"nonce", "program", "tests", "fraction"}. It is read whole
before the program starts, so the program finds neither the tests nor the nonce on any file
or descriptor (its own stdin is at end of file). The program runs as module `solution`
(so its `if __name__ == "__main__":` demo code does not run, as in HumanEval's harness),
then the tests run in the same namespace. The verdict goes to the result channel:

    {"nonce", "passed", "checks_passed", "checks_run", "checks_static", "error"}

`passed`: the program and the tests ran to the end without an exception. With `fraction`,
every `assert` in the tests is rewritten to record its outcome and go on (an exception while
evaluating one counts as a failure): `checks_run` are the asserts executed, `checks_static`
the assert statements in the test source. A program that exits early, kills itself or closes
the channel leaves no verdict. The nonce (random per run, known to the host) marks a verdict
as the harness's; a program that digs it out of this process's memory can forge one, so the
verdict resists accidents, not a deliberate attack (the sandbox contains those).
"""

import ast
import json
import os
import sys
import types


class _RecordAsserts(ast.NodeTransformer):
    """`assert x` -> `try: assert x / except Exception: RECORD(False) / else: RECORD(True)`."""

    def __init__(self, record: str) -> None:
        self.record = record

    def _call(self, passed: bool) -> ast.stmt:
        func = ast.Attribute(value=ast.Name(id=self.record, ctx=ast.Load()), attr="append", ctx=ast.Load())
        return ast.Expr(value=ast.Call(func=func, args=[ast.Constant(value=passed)], keywords=[]))

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        handler = ast.ExceptHandler(type=ast.Name(id="Exception", ctx=ast.Load()), name=None, body=[self._call(False)])
        return ast.Try(body=[node], handlers=[handler], orelse=[self._call(True)], finalbody=[])


def _describe(phase: str, error: BaseException) -> str:
    """`phase: Type: message (file line N)`, the line being the last one in the program or tests."""
    try:
        text = f"{type(error).__name__}: {error}".removesuffix(": ")
    except Exception:  # a hostile __str__
        text = type(error).__name__
    where, tb = "", error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in ("program.py", "tests.py"):
            where = f" ({tb.tb_frame.f_code.co_filename} line {tb.tb_lineno})"
        tb = tb.tb_next
    return f"{phase}: {text[:300]}{where}"


def main() -> None:
    result_fd = int(os.environ["RLVR_RESULT_FD"])
    job = json.loads(sys.stdin.buffer.read())
    verdict = {
        "nonce": job["nonce"],
        "passed": False,
        "checks_passed": 0,
        "checks_run": 0,
        "checks_static": 0,
        "error": None,
    }
    checks: list = []
    record = "_rlvr_checks_" + job["nonce"][:16]
    solution = types.ModuleType("solution")
    sys.modules["solution"] = solution  # for what looks a class's module up (dataclasses, pickle)
    namespace = solution.__dict__
    phase = "program"
    try:
        exec(compile(job["program"], "program.py", "exec"), namespace)
        phase = "tests"
        tree = ast.parse(job["tests"], "tests.py")
        verdict["checks_static"] = sum(isinstance(node, ast.Assert) for node in ast.walk(tree))
        if job["fraction"]:
            tree = ast.fix_missing_locations(_RecordAsserts(record).visit(tree))
            namespace[record] = checks
        exec(compile(tree, "tests.py", "exec"), namespace)
        verdict["passed"] = not job["fraction"] or all(checks)
    except BaseException as e:  # SystemExit too: exiting before the tests end is not passing
        verdict["error"] = _describe(phase, e)
    verdict["checks_run"] = len(checks)
    verdict["checks_passed"] = sum(1 for c in checks if c is True)
    if job["fraction"] and verdict["passed"] is False and verdict["error"] is None:
        verdict["error"] = "tests: some asserts failed"
    data = json.dumps(verdict).encode()
    while data:
        data = data[os.write(result_fd, data) :]


main()
