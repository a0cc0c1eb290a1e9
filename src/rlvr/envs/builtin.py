"""The built-in environments: single_turn, calculator, python_tool, code_tests.

Tool calls: an action calls a tool with a tag block, `<calc>12*(3+4)</calc>` or
`<python>print(2**10)</python>`, or in the Hermes format that instruct models' tool templates
use, `<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>`. The first call
of an action runs; the tool's output comes back as one message (role env.observation_role),
cut to env.max_observation_chars. An action that calls no tool is the final answer.
"""

from __future__ import annotations

import ast
import json
import operator
import re

from rlvr.envs.base import EnvContext, EnvStep
from rlvr.records import Problem


class SingleTurn:
    """One completion, scored by the run's verifier: rlvr's original path."""

    stop: tuple[str, ...] = ()

    def __init__(self, problem: Problem, context: EnvContext):
        pass

    def reset(self, problem: Problem):
        return None

    def step(self, action: str) -> EnvStep:
        return EnvStep(done=True)

    def close(self) -> None:
        pass


class ToolEnv:
    """A model that may call one tool per turn before it answers; the verifier scores the answer."""

    tool: str  # the tag and the Hermes name
    stop: tuple[str, ...] = ()

    def __init__(self, problem: Problem, context: EnvContext):
        self.config, self.context = context.config, context
        self.stop = (f"</{self.tool}>", "</tool_call>")

    def reset(self, problem: Problem):
        return None

    def step(self, action: str) -> EnvStep:
        call = tool_call(action, self.tool)
        if call is None:
            return EnvStep(done=True)
        output, ok = self.run(call)
        if len(output) > self.config.max_observation_chars:
            output = output[: self.config.max_observation_chars] + "\n[output truncated]"
        return EnvStep(
            [{"role": self.config.observation_role, "content": output}],
            done=False,
            tool_calls=1,
            tool_errors=0 if ok else 1,
        )

    def run(self, call: str) -> tuple[str, bool]:
        """The tool's output for `call`, and whether it succeeded."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def tool_call(action: str, tool: str) -> str | None:
    """The argument of the action's first call of `tool` (a `<tool>..</tool>` block, or a Hermes
    `<tool_call>` JSON naming it: its `code`/`expression`/first argument), else None."""
    tag = re.search(rf"<{tool}>(.*?)(?:</{tool}>|\Z)", action, re.DOTALL)
    hermes = re.search(r"<tool_call>(.*?)(?:</tool_call>|\Z)", action, re.DOTALL)
    if hermes and (not tag or hermes.start() < tag.start()):
        try:
            call = json.loads(hermes.group(1))
        except json.JSONDecodeError:
            return None if not tag else tag.group(1).strip()
        if isinstance(call, dict) and call.get("name") == tool:
            arguments = call.get("arguments") or {}
            if isinstance(arguments, dict) and arguments:
                return str(next(iter(arguments.values())))
    return tag.group(1).strip() if tag else None


class Calculator(ToolEnv):
    """`<calc>EXPR</calc>` -> the value of an arithmetic expression (+ - * / // % **, parentheses):
    parsed, never evaluated as code, with bounds on exponents and sizes."""

    tool = "calc"
    errors = (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError)  # what a bad expression raises

    def run(self, call: str) -> tuple[str, bool]:
        try:
            return self.evaluate(call), True
        except self.errors as err:
            return f"error: {err.__class__.__name__}: {err}", False

    @staticmethod
    def evaluate(expression: str) -> str:
        return _format(_arithmetic(ast.parse(expression, mode="eval").body))


class PythonTool(ToolEnv):
    """`<python>CODE</python>` -> its stdout (and stderr), run in rlvr's sandbox (never here)."""

    tool = "python"

    def run(self, call: str) -> tuple[str, bool]:
        result = self.context.sandbox_pool().run(call)
        output = result.stdout + (f"\n{result.stderr}" if result.stderr.strip() else "")
        if result.status != "ok":
            output += f"\n[{result.status}: {', '.join(result.limits) or 'the program failed'}]"
        return output.strip() or "(no output)", result.status == "ok" and result.exit_code == 0


class CodeTestsEnv:
    """Program synthesis: the response's last python block against the row's tests (its answer),
    in the sandbox; reward 1 if they pass (env.options.fraction: the fraction of asserts passed).
    With env.max_turns > 1 a failing attempt gets the failure back and may try again."""

    stop: tuple[str, ...] = ()

    def __init__(self, problem: Problem, context: EnvContext):
        from rlvr.rewards.code_tests import CodeTests

        self.tests, self.config = problem.answer, context.config
        self.verifier = CodeTests(
            fraction=bool(context.config.options.get("fraction", False)), pool=context.sandbox_pool()
        )

    def reset(self, problem: Problem):
        return None

    def step(self, action: str) -> EnvStep:
        score = self.verifier(action, self.tests)
        if score.reward >= 1.0 or self.config.max_turns == 1:
            return EnvStep(reward=score.reward, done=True)
        feedback = f"The tests did not pass ({score.status}): {score.detail or 'no program found'}"
        return EnvStep(
            [{"role": self.config.observation_role, "content": feedback[: self.config.max_observation_chars]}],
            reward=score.reward,
            done=False,
        )

    def close(self) -> None:
        pass


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_MAX_DIGITS = 1000


def _arithmetic(node: ast.expr):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _arithmetic(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        value = _OPERATORS[type(node.op)](left, right)
        if isinstance(value, int) and value.bit_length() > _MAX_DIGITS * 3.33:
            raise OverflowError("result too large")
        return value
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")


def _format(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)
