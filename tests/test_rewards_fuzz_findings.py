"""Inputs the fuzz campaign (benchmarks/verifier_fuzz.py) broke while it was being built, each
now a fixed case; the generator has changed since, so these are the inputs themselves."""

import pytest

from rlvr.rewards import get_verifier

BIG = "7" + "3" * 5000  # Python refuses int() of more than 4300 digits


@pytest.mark.parametrize("name", ["math", "gsm8k", "aime"])
def test_numbers_past_the_int_conversion_limit_are_text(name):
    """A 5,001- or 100,001-digit number raised ValueError inside math, gsm8k and aime."""
    verify = get_verifier(name)
    assert verify(f"so \\boxed{{{BIG}}}", "5").reward == 0
    assert verify(f"so \\boxed{{{BIG}}}", BIG).status in ("ok", "error")  # aime/gsm8k refuse such a reference
    assert get_verifier("math")(f"\\boxed{{{BIG}}}", BIG).reward == 1  # the same spelling still matches


def test_regex_reference_with_an_impossible_repeat_is_a_bad_reference():
    """`re.compile` raised OverflowError ("the repetition number is too large")."""
    score = get_verifier("regex")("\\boxed{aaa}", "a{4294967296}")
    assert (score.reward, score.status) == (0.0, "error")


def refuse(*args, **kwargs):
    raise AssertionError("this input must not reach this function")


@pytest.mark.parametrize("depth", [7, 11, 40])
def test_deeply_nested_groups_skip_the_grammar(depth, monkeypatch):
    """11 nested brace groups cost the LaTeX grammar ~1.5 s per parse: two parses passed the 2 s limit."""
    monkeypatch.setattr("rlvr.rewards.equivalence.parse", refuse)
    answer = "{" * depth + "\\frac{1}{2}" + "}" * depth
    assert get_verifier("math")(f"\\boxed{{{answer}}}", "10, 4, 2").reward == 0


def test_binomials_with_huge_arguments_skip_the_grammar(monkeypatch):
    """`\\binom{y}{128910}` made sympy expand a degree-128910 polynomial (minutes; the pool's timeout
    caught it)."""
    monkeypatch.setattr("rlvr.rewards.equivalence.parse", refuse)
    assert get_verifier("math")("\\boxed{\\binom{y}{128910}}", "\\binom{y}{2}").reward == 0


@pytest.mark.parametrize(
    "response",
    ["\\boxed{" + "1 1/2 " * 150_000 + "}", "\\boxed{" + "1" * 1_000_000 + "}"],
    ids=["megabyte_box_of_mixed_numbers", "megabyte_number"],
)
def test_megabyte_answers_are_compared_as_strings(response, monkeypatch):
    """Megabyte box contents took 1-2.6 s to normalise and compare (timeouts under load): answers
    past MAX_ANSWER_CHARS now compare as plain strings."""
    monkeypatch.setattr("rlvr.rewards.verifiers.equivalent", refuse)
    monkeypatch.setattr("rlvr.rewards.verifiers.hedges", refuse)
    assert get_verifier("math")(response, "5").reward == 0
    assert get_verifier("math")(response, response[7:-1]).reward == 1
    monkeypatch.setattr("rlvr.rewards.verifiers.normalize", lambda text, *a: refuse() if len(text) > 10_000 else text)
    assert get_verifier("aime")(response, "5").reward == 0


def test_a_hundred_thousand_different_boxes_are_a_hedge(monkeypatch):
    """100,000 distinct boxes were normalised one by one (1.3-1.8 s); more than 64 are a hedge."""
    from rlvr.rewards import verifiers

    calls = []
    monkeypatch.setattr(
        verifiers, "normalize", lambda text, *a, real=verifiers.normalize: calls.append(text) or real(text, *a)
    )
    response = "".join(f"\\boxed{{{i}}}" for i in range(100_000)) + "\\boxed{5}"
    for name in ("math", "aime", "gsm8k"):
        assert get_verifier(name)(response, "5").reward == 0, name
    assert len(calls) < 10


@pytest.mark.parametrize(
    "text", ["1" + " " * 200_000 + "2", "1" + " \t" * 100_000 + "x", "$ " * 100_000], ids=["spaces", "tabs", "dollars"]
)
def test_long_runs_normalise_in_linear_time(text):
    """Found while preparing the campaign: a list-comma pattern with a leading `\\s*` and a loop
    peeling one `$` per pass were quadratic (20,000 spaces: 9.9 s). At 200,000 characters a
    quadratic pass would take ~1,000 s; linear ones take well under a second, so 5 s only
    tells the two apart."""
    import time

    from rlvr.rewards.equivalence import normalize

    started = time.monotonic()
    normalize(text)
    assert time.monotonic() - started < 5
