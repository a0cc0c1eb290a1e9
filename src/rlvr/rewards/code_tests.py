"""The `code` verifier: a response's program against the row's tests, in the sandbox.

Rules:
- The program is the last fenced code block tagged `python`, `py` or `python3` (any case);
  without one, the last untagged block; without either, status "no_answer". Only closed
  fences count (a completion cut off inside its block has no program), and as in CommonMark a
  fence closes only on a line of backticks alone: "```python" after "```markdown" opens nothing
  new. A block tagged `markdown` or `md` is read for its own blocks, a fence left open inside it
  closing where it ends: small models asked for "a markdown code block" often wrap the ```python
  block in one ("```markdown", "```python", the program, "```").
- The reference is Python test code (assert statements, a `check(candidate)` and its call,
  ...). It runs after the program in the same namespace, in one fresh sandbox per response
  (`code_tests_harness.py` runs both there; this process only reads strings).
- reward 1.0 if the program and the tests run to the end without an exception, else 0.0.
  With `fraction=True`: asserts passed / max(asserts executed, assert statements in the
  tests), each assert recorded and passed over on failure; tests without asserts score 1.0
  if they finish cleanly. An exception outside an assert stops the tests: the asserts not
  reached count as failed.
- status "ok" when the harness delivered a verdict (a failing or crashing program included:
  that is a judgement, `detail` says what failed); "timeout" at the wall-clock or CPU limit;
  "error" when no verdict came back (the memory limit, an exit before the tests, a crash);
  `detail` says what happened, and names a weak isolation on every row it affects.
- `extracted` is the program (what this verifier read from the response).
- A run SIGKILLed with no limit hit was killed from outside the sandbox (an operator, the OOM
  killer): the machine's fault, not the response's. It is logged in one line (a warning) and run
  once more; a second such end scores "error". (A program that SIGKILLs itself runs twice.)
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import signal
import textwrap
from concurrent.futures import Future
from importlib import resources

from pydantic import ValidationError

from rlvr.config import SandboxConfig
from rlvr.records import Score
from rlvr.sandbox import SandboxPool, SandboxResult, SandboxUnavailable

HARNESS = (resources.files("rlvr.rewards") / "code_tests_harness.py").read_text()
PYTHON_TAGS = ("python", "py", "python3")
MARKDOWN_TAGS = ("markdown", "md")
SANDBOX_MARGIN_S = 5.0  # start-up and clean-up of one run, beyond its wall-clock limit
_log = logging.getLogger(__name__)
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w.+-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)


def last_python_block(response: str) -> str | None:
    """The program in `response` (rules in the module doc), dedented, or None."""
    tagged, untagged = _blocks(response)
    block = tagged if tagged is not None else untagged
    return None if block is None else textwrap.dedent(block)


def _blocks(text: str) -> tuple[str | None, str | None]:
    """The last python-tagged and the last untagged block of `text`, markdown blocks read through."""
    tagged, untagged = None, None
    for match in _FENCE.finditer(text):
        tag, body = match.group(1).lower(), match.group(2)
        if tag in PYTHON_TAGS:
            tagged = body
        elif tag in MARKDOWN_TAGS:
            # the markdown block's end closes a fence left open inside it, as a container's end does
            inner_tagged, inner_untagged = _blocks(textwrap.dedent(body) + "```\n")
            tagged = inner_tagged if inner_tagged is not None else tagged
            untagged = inner_untagged if inner_untagged is not None else untagged
        elif not tag:
            untagged = body
    return tagged, untagged


def sandbox_config(options: dict) -> SandboxConfig:
    """SandboxConfig from verifier options, with bad ones as a one-line ValueError."""
    try:
        return SandboxConfig(**options)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"verifier 'code': option {where}: {first['msg']}") from None


def verdict_reward(verdict: dict, fraction: bool) -> float:
    """The reward of a verdict (formula in the module doc)."""
    if not fraction:
        return float(verdict["passed"] is True)
    denominator = max(verdict["checks_run"], verdict["checks_static"])
    return verdict["checks_passed"] / denominator if denominator else float(verdict["passed"] is True)


def _read_verdict(result: SandboxResult, nonce: str) -> dict | None:
    try:
        verdict = json.loads(result.result)
    except ValueError:
        return None
    fields = ("passed", "checks_passed", "checks_run", "checks_static")
    if not isinstance(verdict, dict) or verdict.get("nonce") != nonce or not all(k in verdict for k in fields):
        return None
    return verdict


def _with_isolation(detail: str | None, result: SandboxResult) -> str | None:
    if result.isolation == "strict":
        return detail
    return f"{detail} [isolation {result.isolation}]" if detail else f"isolation {result.isolation}"


def _killed_from_outside(result: SandboxResult) -> bool:
    return result.exit_code == 128 + signal.SIGKILL and not result.limits


def _score(program: str, result: SandboxResult, nonce: str, fraction: bool) -> Score:
    if result.status == "timeout":
        return Score(0.0, "timeout", program, _with_isolation(result.summary, result))
    verdict = _read_verdict(result, nonce)
    if verdict is None:
        last_error = next((line.strip() for line in reversed(result.stderr.splitlines()) if line.strip()), "")
        detail = f"no verdict: {result.summary}" + (f"; stderr: {last_error[:200]}" if last_error else "")
        return Score(0.0, "error", program, detail)
    return Score(verdict_reward(verdict, fraction), "ok", program, _with_isolation(verdict.get("error"), result))


class CodeTests:
    """The `code` verifier (rules in the module doc), over a SandboxPool of its own or a shared one.

    >>> verifier = CodeTests()
    >>> verifier("```python\\ndef f(x):\\n    return 2 * x\\n```", "assert f(2) == 4").reward
    1.0
    """

    def __init__(
        self, *, fraction: bool = False, sandbox: SandboxConfig | None = None, pool: SandboxPool | None = None
    ) -> None:
        self.fraction = fraction
        self._own_pool = pool is None
        self.pool = pool or SandboxPool(sandbox)

    def submit(self, response: str, tests: str) -> Future[Score]:
        """Score one response when a sandbox is free."""
        program = last_python_block(response)
        done: Future[Score] = Future()
        if program is None:
            done.set_result(Score(0.0, "no_answer", None))
            return done
        nonce = secrets.token_hex(16)
        job = json.dumps({"nonce": nonce, "program": program, "tests": tests, "fraction": self.fraction}).encode()

        def finish(run: Future[SandboxResult], retried: bool = False) -> None:
            try:
                result = run.result()
                if not retried and _killed_from_outside(result):
                    _log.warning(
                        f"sandboxed program killed from outside the sandbox ({result.summary}); running it once more"
                    )
                    self.pool.submit(HARNESS, stdin=job).add_done_callback(lambda again: finish(again, retried=True))
                    return
                done.set_result(_score(program, result, nonce, self.fraction))
            except BaseException as e:  # a failed run, or a cancelled one at pool shutdown
                done.set_exception(e)

        self.pool.submit(HARNESS, stdin=job).add_done_callback(finish)
        return done

    def __call__(self, response: str, tests: str) -> Score:
        return self.submit(response, tests).result()

    def score_batch(self, responses: list[str], tests: list[str]) -> list[Score]:
        """Scores in order, `pool.config.workers` sandboxes at a time."""
        return [future.result() for future in [self.submit(r, t) for r, t in zip(responses, tests, strict=True)]]

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> CodeTests:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def code_verifier(*, fraction: bool = False, **sandbox) -> CodeTests:
    """`get_verifier("code", fraction=..., wall_s=..., ...)`: every other option is a SandboxConfig field."""
    return CodeTests(fraction=fraction, sandbox=sandbox_config(sandbox))


def prepare_scoring(options: dict, timeout_s: float) -> tuple[dict, float, str]:
    """For `rlvr score`: the code verifier's options (`timeout_s` is the sandbox's wall-clock limit
    unless `wall_s` is given), the scoring pool's per-item budget, and the isolation's name.
    Checks the sandbox here, once, so a refusal is one line before any worker starts."""
    options = {"wall_s": timeout_s, **options}
    try:
        verifier = code_verifier(**options)
    except SandboxUnavailable as e:
        raise ValueError(str(e)) from None
    verifier.close()
    return options, verifier.pool.config.wall_s + SANDBOX_MARGIN_S, verifier.pool.isolation
