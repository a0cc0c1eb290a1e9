"""Verifier registry rules that the labelled set does not pin down: options, errors, custom."""

import pytest

from rlvr.records import Score
from rlvr.rewards import batched_reward, get_verifier
from rlvr.rewards.equivalence import equivalent, normalize


def reward_len_match(response, answer, *, bonus=0.0):
    return float(len(response) == len(answer)) + bonus


@batched_reward
def reward_batch(responses, answers):
    return [Score(float(r == a), "ok", r) for r, a in zip(responses, answers)]


def test_unknown_verifier_and_bad_options_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown verifier 'nope'"):
        get_verifier("nope")
    with pytest.raises(ValueError, match="verifier 'math': unknown option 'colour'; options: extract, "):
        get_verifier("math", colour="red")
    with pytest.raises(ValueError, match=r"option extract: unknown mode\(s\) \['sideways'\]"):
        get_verifier("math", extract=("sideways",))
    with pytest.raises(ValueError, match="option percent='half': choose from either, ratio, number"):
        get_verifier("math", percent="half")
    with pytest.raises(ValueError, match="option decimal_comma='maybe'"):
        get_verifier("math", decimal_comma="maybe")
    with pytest.raises(ValueError, match="option ignore_case='yes'"):
        get_verifier("math", ignore_case="yes")


def test_math_extract_fallbacks():
    assert get_verifier("math")("Answer: 1/2", "0.5").status == "no_answer"
    assert get_verifier("math", extract=("boxed", "answer"))("Answer: 1/2", "0.5").reward == 1.0
    assert get_verifier("math", extract=("boxed", "last_number"))("we get 7 apples", "7").reward == 1.0
    boxed_wins = get_verifier("math", extract=("boxed", "answer"))("Answer: 3 but \\boxed{4}", "4")
    assert boxed_wins.reward == 1.0 and boxed_wins.extracted == "4"


def test_exact_options():
    assert get_verifier("exact", ignore_case=True)("\\boxed{PARIS}", "paris").reward == 1.0
    assert get_verifier("exact", extract="whole")("  Paris \n", "Paris").reward == 1.0


def test_bad_references_are_status_error():
    assert get_verifier("aime")("\\boxed{3}", "three").status == "error"
    assert get_verifier("gsm8k")("#### 3", "no number").status == "error"
    assert get_verifier("regex")("\\boxed{3}", "([").status == "error"


def test_custom_module_function_with_options():
    score = get_verifier(f"{__name__}:reward_len_match", bonus=0.5)("abc", "xyz")
    assert score == Score(1.5, "ok", None)


def test_custom_file_spec_and_batched():
    fn = get_verifier(f"{__file__}:reward_batch")
    assert fn("a", "a").reward == 1.0
    assert [s.reward for s in fn.score_batch(["a", "b"], ["a", "c"])] == [1.0, 0.0]


def test_custom_spec_errors():
    with pytest.raises(ValueError, match="has no function 'missing'"):
        get_verifier(f"{__name__}:missing")
    with pytest.raises(ValueError, match="no file"):
        get_verifier("/nonexistent/file.py:f")


def test_normalize_keeps_meaning():
    assert normalize("$\\left( 1, 2 \\right)$") == "(1, 2)"  # list commas are spelled ", "
    assert normalize("\\dfrac{1}{2}.") == "\\frac{1}{2}"
    assert normalize("\\pi r") == "\\pi r"  # the space separates two letters


def test_equivalence_is_exact_for_decimals():
    assert not equivalent("0.3333", "\\frac13")
    assert equivalent("0.25", "\\frac{1}{4}")
