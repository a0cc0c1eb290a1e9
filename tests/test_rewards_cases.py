"""The labelled verifier set (tests/data/verifier_cases.jsonl) passes, case by case."""

import json
from collections import Counter
from pathlib import Path

import pytest

from rlvr.rewards import get_verifier

CASES = [json.loads(line) for line in (Path(__file__).parent / "data" / "verifier_cases.jsonl").open()]
CATEGORIES = {
    "fraction_decimal",
    "radical",
    "pi",
    "interval",
    "set_tuple",
    "degree",
    "percent",
    "text_units",
    "thousands",
    "matrix",
    "equation",
    "expression",
    "extraction",
    "hedging",
    "aime",
    "gsm8k",
    "exact",
    "regex",
    "adversarial",
}


def test_set_is_large_and_covers_every_category():
    counts = Counter(c["category"] for c in CASES)
    assert len(CASES) >= 200
    assert set(counts) == CATEGORIES
    assert all(n >= 5 for n in counts.values()), counts


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case):
    score = get_verifier(case["verifier"])(case["response"], case["answer"])
    assert score.reward == case["expected"], score
    assert score.status in ("ok", "no_answer")
