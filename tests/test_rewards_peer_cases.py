"""Peers' labelled cases (tests/data/peer_cases.jsonl, sources in peer_cases_NOTICE.md).

Boxed cases must score as their source expects, except judgment calls, which must score as rlvr
decides them (field "rlvr", reasons in docs/rewards.md). Free-text
cases (no box) are read with the extraction fallbacks and must only return cleanly.
"""

import json
from pathlib import Path

import pytest

from rlvr.rewards import get_verifier

CASES = [json.loads(line) for line in (Path(__file__).parent / "data" / "peer_cases.jsonl").open()]
BOXED = [c for c in CASES if c["boxed"]]
FREE_TEXT = [c for c in CASES if not c["boxed"]]


def want(case):
    return case["rlvr"] if case["judgment"] else case["expected"]


def test_set_covers_every_source_and_beats_the_target():
    assert {c["source"] for c in CASES} == {
        "Math-Verify",
        "lighteval",
        "NeMo-Skills",
        "hendrycks-MATH",
        "Qwen2.5-Math",
        "TRL",
        "verl",
    }
    assert all(c["licence"] and c["origin"] for c in CASES)
    plain = [c for c in BOXED if not c["judgment"]]
    verify = get_verifier("math")
    right = sum(verify(c["response"], c["answer"]).reward == c["expected"] for c in plain)
    assert right / len(plain) >= 0.99, (right, len(plain))


@pytest.mark.parametrize("case", BOXED, ids=[c["id"] for c in BOXED])
def test_boxed_case(case):
    score = get_verifier("math")(case["response"], case["answer"])
    assert score.reward == want(case), score


def test_free_text_cases_return_cleanly():
    verify = get_verifier("math", extract=["boxed", "answer", "last_number"])
    for case in FREE_TEXT:
        assert verify(case["response"], case["answer"]).status in ("ok", "no_answer"), case["id"]
