"""The warm start's readiness figures, read off scored samples (rlvr.demo.skills)."""

from __future__ import annotations

import pytest

from rlvr.config import ReadinessCheck
from rlvr.data.synthetic import question_text
from rlvr.demo.skills import Skills, first_step, measure, shortfalls
from rlvr.eval.rollouts_file import SampleRow

SUM = question_text(47, "+", 85)  # reference working "7+5=12,4+8+1=13. \boxed{132}"
PRODUCT = question_text(347, "*", 56)  # 19432, answered directly or with the calculator


def row(problem_id: str, response: str, extracted: str | None, answer: str) -> SampleRow:
    return SampleRow(
        problem_id=problem_id, reward=float(extracted == answer), extracted=extracted, response=response, answer=answer
    )


def test_a_worked_sum_copies_its_operands_when_its_first_column_is_the_reference_one():
    rows = [
        row("sum", "7+5=12,4+8+1=13. \\boxed{132}", "132", "132"),
        row("sum", "7+5=13,4+8+1=14. \\boxed{142}", "142", "132"),  # copied right, added wrong
        row("sum", "7+6=13,4+8+1=14. \\boxed{142}", "142", "132"),  # a digit not in the question
        row("sum", "\\boxed{132}", "132", "132"),  # no working at all: nothing copied
        row("sum", "7+5=12,4+8", None, "132"),  # copied right, cut off before its box
    ]
    skills = measure(rows, {"sum": SUM})
    assert skills == Skills(samples=5, accuracy=0.4, format=0.8, operand_copy=0.6, result_copy=None)


def test_calls_are_held_to_the_question_and_boxes_to_the_calculator_value():
    rows = [
        row("p", "<calc>347*56</calc>\ntool: 19432\n\\boxed{19432}", "19432", "19432"),
        row("p", "<calc>347*56</calc>\ntool: 19432\n\\boxed{19332}", "19332", "19432"),  # did not copy the result
        row(
            "p", "<calc>185*72</calc>\ntool: 13320\n\\boxed{13320}", "13320", "19432"
        ),  # copied the result, not the operands
        row("p", "\\boxed{19000}", "19000", "19432"),  # a guess copies nothing
    ]
    skills = measure(rows, {"p": PRODUCT})
    assert (skills.operand_copy, skills.result_copy, skills.accuracy, skills.format) == (2 / 3, 2 / 3, 0.25, 1.0)


def test_an_answer_only_task_has_no_copy_figures():
    skills = measure([row("p", "\\boxed{19432}", "19432", "19432")], {"p": PRODUCT})
    assert skills.operand_copy is None and skills.result_copy is None


def test_a_count_copies_its_start_and_step():
    question = "What is 23+7*3? Answer in \\boxed{}."
    rows = [
        row("c", "1:23+7=30,2:30+7=37,3:37+7=44. \\boxed{44}", "44", "44"),
        row("c", "1:23+8=31. \\boxed{31}", "31", "44"),
    ]
    assert measure(rows, {"c": question}).operand_copy == 0.5


@pytest.mark.parametrize("text, step", [("7+5=12,4+8+1=13. \\boxed{132}", "7+5"), ("\\boxed{3}", None), ("", None)])
def test_first_step(text, step):
    assert first_step(text) == step


def test_every_shortfall_is_named_and_a_ready_model_has_none():
    check = ReadinessCheck(base_window=(0.2, 0.7))
    ready = Skills(samples=256, accuracy=0.41, format=0.99, operand_copy=0.97, result_copy=0.95)
    assert shortfalls(ready, check) == []
    # a warm start that learned the format only: nothing copied, nothing right
    stuck = Skills(samples=256, accuracy=0.0, format=0.98, operand_copy=0.0, result_copy=0.0)
    assert shortfalls(stuck, check) == [
        "operand copy 0.00 < 0.8",
        "result copy 0.00 < 0.6",
        "base 0.000 outside [0.2, 0.7]",
    ]
    assert shortfalls(stuck, check, window=False) == ["operand copy 0.00 < 0.8", "result copy 0.00 < 0.6"]
    saturated = Skills(samples=256, accuracy=0.96, format=1.0, operand_copy=None, result_copy=None)
    assert shortfalls(saturated, check) == ["base 0.960 outside [0.2, 0.7]"]


def test_a_window_must_be_ordered_inside_zero_one():
    with pytest.raises(ValueError, match="low < high"):
        ReadinessCheck(base_window=(0.7, 0.2))


def test_the_closest_attempt_has_the_fewest_shortfalls_then_the_base_nearest_the_window():
    from rlvr.demo.warm_start import Attempt

    def skills(base: float) -> Skills:
        return Skills(samples=4, accuracy=base, format=1.0, operand_copy=None, result_copy=None)

    below = Attempt(seed=0, skills=skills(0.05), missing=["base"])
    above = Attempt(seed=1, skills=skills(0.75), missing=["base"])
    unchecked = Attempt(seed=2)
    worse = Attempt(seed=3, skills=skills(0.5), missing=["base", "format"])
    ranked = sorted([unchecked, worse, below, above], key=lambda a: a.closeness((0.2, 0.7)))
    assert [a.seed for a in ranked] == [1, 0, 2, 3]
