"""What a warm-started demo model can do, read off its scored samples of held-out rows: the
figures the warm start's readiness check (`rlvr.config.ReadinessCheck`) holds to thresholds.

- format: the share of samples whose answer the verifier extracted (a `\\boxed{}` for `math`);
- operand copy: of the samples that copy the question's operands, the share that copied them
  right. What is compared is the first thing copied: a calculator call's expression, or the first
  step of a worked answer up to its `=` (a sum's last column "7+5", a count's "1:23+7"), against
  the reference working `rlvr.data.synthetic.solution_text` writes;
- result copy: of the samples whose calculator call returned a value, the share that box that
  value (a model that calls the calculator, then boxes a product computed "in the head", passes on
  accuracy alone);
- accuracy: the mean reward, which the run's evaluation before RL estimates as avg@k.

Copying is what a tiny model learns through a sharp transition; accuracy alone can sit inside its
window for the wrong reason (e.g. guessed answers), so both are checked.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from rlvr.config import ReadinessCheck
from rlvr.data.synthetic import question_expression, solution_text
from rlvr.envs.builtin import Calculator
from rlvr.eval.rollouts_file import SampleRow

_CALL = re.compile(r"<calc>(.*?)</calc>", re.S)


@dataclass(frozen=True)
class Skills:
    samples: int
    accuracy: float
    format: float
    operand_copy: float | None  # None: no sample copies operands (an answer-only task)
    result_copy: float | None  # None: no sample got a value from the calculator

    def as_dict(self) -> dict:
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in asdict(self).items()}

    def describe(self, samples_per_row: int) -> str:
        parts = [f"format {self.format:.2f}"]
        if self.operand_copy is not None:
            parts.append(f"operand copy {self.operand_copy:.2f}")
        if self.result_copy is not None:
            parts.append(f"result copy {self.result_copy:.2f}")
        return ", ".join(parts + [f"base avg@{samples_per_row} {self.accuracy:.3f}"])


def first_step(text: str) -> str | None:
    """The left-hand side of a worked answer's first step ("7+5=12,4+8+1=13. \\boxed{132}" -> "7+5");
    None where the text works nothing out before its box."""
    working = text.split("\\boxed")[0]
    if "=" not in working:
        return None
    return working.split(",")[0].split("=")[0].strip()


def measure(rows: list[SampleRow], questions: dict[str, str]) -> Skills:
    """The skills of `rows` (scored samples; `questions` maps each problem id to its question)."""
    if not rows:
        raise ValueError("no samples to measure")
    copies: list[bool] = []
    results: list[bool] = []
    for row in rows:
        question, response = questions[row.problem_id], row.response or ""
        call = _CALL.search(response)
        if call is not None:
            copies.append(call.group(1).strip() == question_expression(question))
            value = _value(call.group(1))
            if value is not None:
                results.append(row.extracted is not None and row.extracted.strip() == value)
            continue
        reference = first_step(solution_text(question, row.answer or ""))
        if reference is not None:
            copies.append(first_step(response) == reference)
    return Skills(
        samples=len(rows),
        accuracy=sum(row.reward for row in rows) / len(rows),
        format=sum(row.extracted is not None for row in rows) / len(rows),
        operand_copy=sum(copies) / len(copies) if copies else None,
        result_copy=sum(results) / len(results) if results else None,
    )


def shortfalls(skills: Skills | None, check: ReadinessCheck, window: bool = True) -> list[str]:
    """What keeps `skills` from passing `check`, one phrase each ([] = ready for RL); without
    `window`, the skills alone, not the base accuracy."""
    if skills is None:
        return ["not checked"]
    low, high = check.base_window
    missing = []
    if skills.format < check.min_format:
        missing.append(f"format {skills.format:.2f} < {check.min_format}")
    if skills.operand_copy is not None and skills.operand_copy < check.min_operand_copy:
        missing.append(f"operand copy {skills.operand_copy:.2f} < {check.min_operand_copy}")
    if skills.result_copy is not None and skills.result_copy < check.min_result_copy:
        missing.append(f"result copy {skills.result_copy:.2f} < {check.min_result_copy}")
    if window and not low <= skills.accuracy <= high:
        missing.append(f"base {skills.accuracy:.3f} outside [{low}, {high}]")
    return missing


def _value(expression: str) -> str | None:
    try:
        return Calculator.evaluate(expression)
    except Calculator.errors:
        return None
