"""How the math verifier reads answers: the three error kinds found on peers' suites (intervals
against inequalities, percent words, a comma and a space), their neighbours, and the options
that decide the judgment calls (docs/rewards.md)."""

import pytest

from rlvr.rewards import get_verifier
from rlvr.rewards.equivalence import normalize
from rlvr.rewards.hedging import hedges, is_scalar


def reward(response, answer, **options):
    return get_verifier("math", **options)(response, answer).reward


INTERVAL_VS_INEQUALITY = [
    ("\\boxed{(0,1)}", "0<x<1", 1),
    ("\\boxed{(0, 1)}", "0 < x < 1", 1),
    ("\\boxed{[2,\\infty)}", "x \\ge 2", 1),
    ("\\boxed{[2, \\infty)}", "x \\geq 2", 1),
    ("\\boxed{(-\\infty, 3]}", "x \\leq 3", 1),
    ("\\boxed{(3, \\infty)}", "x>3", 1),
    ("\\boxed{x > 3}", "(3,\\infty)", 1),
    ("\\boxed{[0,1)}", "0 \\le x < 1", 1),
    ("\\boxed{(-793, 10)}", "-793 < a < 10", 1),
    ("\\boxed{(0,1]}", "0<x<1", 0),  # a closed end is another set
    ("\\boxed{[2,\\infty)}", "x \\geq 3", 0),
    ("\\boxed{(1,0)}", "0<x<1", 0),
    # hedges against a single value are still hedges; a point or interval is one object
    ("\\boxed{0, 1}", "1", 0),
    ("\\boxed{\\{1, 2\\}}", "2", 0),
    ("\\boxed{(3, 5)}", "3", 0),
    ("\\boxed{2 \\text{ or } 3}", "3", 0),
]

PERCENT_WORDS = [
    ("\\boxed{28 percent}", "28\\%", 1),
    ("\\boxed{28 pct}", "28\\%", 1),
    ("\\boxed{28 percentage}", "28\\%", 1),
    ("\\boxed{28 Percent}", "28\\%", 1),
    ("\\boxed{28 per cent}", "28%", 1),
    ("\\boxed{28\\text{ percent}}", "28\\%", 1),
    ("\\boxed{28\\%}", "28 percent", 1),
    ("\\boxed{28 percent}", "0.28", 1),
    ("\\boxed{28 percent}", "28", 1),
    ("\\boxed{12.5 pct}", "\\frac{1}{8}", 1),
    ("\\boxed{28 percent}", "27\\%", 0),
    ("\\boxed{28 percentile}", "28\\%", 0),  # not a percent word
]

COMMA_AND_SPACE = [
    ("\\boxed{32, 349}", "32349", 0),
    ("\\boxed{3, 500}", "3500", 0),
    ("\\boxed{1, 000}", "1000", 0),
    ("\\boxed{32,349}", "32349", 1),
    ("\\boxed{32{,}349}", "32349", 1),
    ("\\boxed{32,\\! 349}", "32349", 1),
    ("\\boxed{11,\\! 111,\\! 111,\\! 100}", "11111111100", 1),
    ("\\boxed{1 000}", "1000", 1),
    ("\\boxed{2\\,000}", "2000", 1),
    ("\\boxed{12,345.5}", "12345.5", 1),
    ("\\boxed{32, 349}", "32, 349", 1),
    ("\\boxed{3, 500}", "500, 3", 1),
    ("\\boxed{1,000, 2,000}", "1000, 2000", 1),
    ("\\boxed{(12,102)}", "(12, 102)", 1),  # alone in brackets, digit groups are a pair
    ("\\boxed{(2,12) \\cup (12,102)}", "(2, 12) \\cup (12, 102)", 1),
    ("\\boxed{0,111}", "111", 0),  # a group starting with 0 is no thousands group
]


@pytest.mark.parametrize("response, answer, expected", INTERVAL_VS_INEQUALITY + PERCENT_WORDS + COMMA_AND_SPACE)
def test_error_kinds_and_neighbours(response, answer, expected):
    assert reward(response, answer) == expected


def test_hedge_rules():
    assert not is_scalar("0<x<1") and not is_scalar("x \\ge 2") and not is_scalar("(0,1)")
    assert is_scalar("3") and is_scalar("x = 3")
    assert hedges("3 \\text{ or } 5", "3") and hedges("\\pm 2", "2") and hedges("\\{3, 5\\}", "3")
    assert not hedges("(3, 5)", "3")  # one point: wrong, not a hedge
    assert not hedges("1000,99", "1000.99")  # a decimal comma lists nothing


@pytest.mark.parametrize(
    "response, answer, options, expected",
    [
        ("\\boxed{1000,99}", "1000.99", {"decimal_comma": "auto"}, 1),
        ("\\boxed{0,5}", "\\frac12", {"decimal_comma": "auto"}, 1),
        ("\\boxed{3{,}14}", "3.14", {"decimal_comma": "auto"}, 1),
        ("\\boxed{1,5}", "1, 5", {"decimal_comma": "auto"}, 1),  # against a list the comma lists
        ("\\boxed{-2, 1}", "-2,1", {"decimal_comma": "auto"}, 1),
        ("\\boxed{1,5}", "5", {"decimal_comma": "auto"}, 0),  # neither 1.5 nor a single 5
        ("\\boxed{1000,99}", "1000.99", {"decimal_comma": "never"}, 0),
        ("\\boxed{3{,}14}", "3.14", {"decimal_comma": "never"}, 0),
        ("\\boxed{1,234}", "1.234", {"decimal_comma": "always"}, 1),
        ("\\boxed{1,234}", "1234", {"decimal_comma": "always"}, 0),
        ("\\boxed{1,234}", "1234", {"decimal_comma": "auto"}, 1),
        ("\\boxed{28\\%}", "28", {"percent": "either"}, 1),
        ("\\boxed{28\\%}", "0.28", {"percent": "either"}, 1),
        ("\\boxed{28\\%}", "28", {"percent": "ratio"}, 0),
        ("\\boxed{28\\%}", "\\frac{7}{25}", {"percent": "ratio"}, 1),
        ("\\boxed{28\\%}", "0.28", {"percent": "number"}, 0),
        ("\\boxed{28 pct}", "28", {"percent": "number"}, 1),
    ],
)
def test_decimal_comma_and_percent_policies(response, answer, options, expected):
    assert reward(response, answer, **options) == expected


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("\\boxed{4 4/9}", "\\frac{40}{9}", 1),
        ("\\boxed{4 4/9}", "\\frac{44}{9}", 0),  # the space is not dropped into 44/9
        ("\\boxed{-4 4/9}", "-40/9", 1),
        ("\\boxed{4\\frac{4}{9}}", "40/9", 1),
        ("\\boxed{1 000 4/9}", "9004/9", 1),
        ("\\boxed{4 0/9}", "4", 1),
        ("\\boxed{11 7/6}", "73/6", 0),  # an improper fraction makes no mixed number
        ("\\boxed{11 6/6}", "12", 0),
        ("\\boxed{4 + 4/9}", "40/9", 1),
        ("\\boxed{11.0 4/9}", "103/9", 0),
    ],
)
def test_mixed_numbers(response, answer, expected):
    assert reward(response, answer) == expected


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("\\boxed{C}", "C. x = 42", 1),
        ("\\boxed{C. x = 42}", "C", 1),
        ("\\boxed{\\text{(D)}}", "(D) Alina", 1),
        ("\\boxed{D}", "D Alina", 1),
        ("\\boxed{(B)}", "C", 0),
        ("\\boxed{C}", "(A) Cecile", 0),
        ("\\boxed{A}", "A", 1),
    ],
)
def test_choice_letters(response, answer, expected):
    assert reward(response, answer) == expected


def test_reasoning_end_and_boxed_references():
    verify = get_verifier("math")
    assert verify("<think>maybe \\boxed{41}</think> so \\boxed{42}", "42").reward == 1
    assert verify("<think> My answer is \\boxed{42} </think> Some other text.", "42").status == "no_answer"
    assert verify("<think> unfinished, \\boxed{42}", "42").status == "no_answer"
    assert reward("<think> \\boxed{42} </think>", "42", reasoning_end="") == 1
    assert reward("[R] \\boxed{1} [/R] \\boxed{2}", "2", reasoning_end="[/R]") == 1
    assert verify("\\boxed{7}", "We add. The total is $\\boxed{7}$.").reward == 1
    assert verify("\\boxed{1, 2}", "$\\boxed{1}$ and $\\boxed{2}$").reward == 1


def test_ignore_case_and_normalisation():
    assert reward("\\boxed{\\text{Paris}}", "paris") == 1  # math-verify compares symbols case-insensitively
    assert reward("\\boxed{\\text{Paris}}", "paris", ignore_case=False) == 0
    assert reward("\\boxed{2X+1}", "1+2x", ignore_case=False) == 0
    assert reward("\\boxed{2x+1}", "1+2x", ignore_case=False) == 1
    assert reward("\\boxed{\\frac{\\pi}{2}}", "\\frac{\\pi}{2}", ignore_case=False) == 1
    assert reward("\\boxed{x \\in [-2,7]}", "-2 \\\\le x \\\\le 7") == 1  # doubled escapes
    assert reward("\\boxed{-2 \\le x \\le 7}", "x \\in [-2,7]") == 1  # both directions
    assert (
        reward("\\boxed{\\begin{pmatrix}1\\\\\\frac{1}{2}\\end{pmatrix}}", "\\begin{pmatrix}1 \\\\ 0.5\\end{pmatrix}")
        == 1
    )
    assert normalize("12 $ and $13") == normalize("12\\text{ and }13")
    assert normalize("185\\") == "185"


def test_free_text_with_fallbacks():
    plain = get_verifier("math")
    fallbacks = get_verifier("math", extract=["boxed", "answer", "last_number"])
    assert plain("The answer is 5.", "5").status == "no_answer"
    assert fallbacks("The answer is 5.", "5").reward == 1
    assert fallbacks("Final Answer: The final answer is $14{,}916$. I hope it is correct.", "14916").reward == 1
    assert fallbacks("We get 7 apples", "7").reward == 1
    assert get_verifier("math", extract="boxed,answer")("Answer: 1/2", "0.5").reward == 1
