"""The synthetic tasks: problems drawn by seed and split without overlap, and the worked
solutions the warm start teaches (each a correct derivation of the boxed answer)."""

import re

import pytest

from rlvr.data.synthetic import counting_problems, solution_text
from rlvr.rewards.verifiers import get_verifier


def test_column_addition_is_worked_right_to_left_with_carries():
    assert solution_text("What is 47+85? Answer in \\boxed{}.", "132") == "7+5=12,4+8+1=13. \\boxed{132}"
    assert solution_text("What is 3*4? Answer in \\boxed{}.", "12") == "\\boxed{12}"


def test_counting_problems_split_by_seed_without_overlap():
    train, test = counting_problems(seed=0, max_count=32, train_size=300, test_size=50)
    again, _ = counting_problems(seed=0, max_count=32, train_size=300, test_size=50)
    other, _ = counting_problems(seed=1, max_count=32, train_size=300, test_size=50)
    assert [p.question for p in train] == [p.question for p in again] != [p.question for p in other]
    questions = [p.question for p in train + test]
    assert len(set(questions)) == len(questions)  # distinct, so no test problem is trained on
    for p in train + test:
        start, step, count = map(
            int, re.fullmatch(r"What is (\d+)\+(\d+)\*(\d+)\? Answer in \\boxed\{\}\.", p.question).groups()
        )
        assert 0 <= start <= 99 and 2 <= step <= 9 and 1 <= count <= 32
        assert p.answer == str(start + step * count)
    with pytest.raises(ValueError, match="pool"):
        counting_problems(seed=0, max_count=2, train_size=1000, test_size=10)


def test_counting_lengths_are_long_tailed():
    train, _ = counting_problems(seed=0, max_count=32, train_size=2000, test_size=1)
    lengths = sorted(len(solution_text(p.question, p.answer)) for p in train)
    median, p90, longest = lengths[len(lengths) // 2], lengths[int(0.9 * len(lengths))], lengths[-1]
    assert lengths[0] < 30 and 50 < median < 120 and 2 * median < p90 and 350 < longest < 450


def test_a_counting_solution_derives_its_answer_step_by_step():
    text = solution_text("What is 23+7*3? Answer in \\boxed{}.", "44")
    assert text == "1:23+7=30,2:30+7=37,3:37+7=44. \\boxed{44}"
    verify = get_verifier("math")
    for p in counting_problems(seed=0, max_count=32, train_size=50, test_size=1)[0]:
        worked = solution_text(p.question, p.answer)
        steps = worked.split(". ")[0].split(",")
        value = int(re.search(r"What is (\d+)", p.question).group(1))
        for k, step in enumerate(steps, start=1):
            index, left, right, total = map(int, re.fullmatch(r"(\d+):(\d+)\+(\d+)=(\d+)", step).groups())
            assert (index, left, left + right) == (k, value, total)
            value = total
        assert str(value) == p.answer and verify(worked, p.answer).reward == 1.0
