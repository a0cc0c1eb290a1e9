"""The eval estimators against hand-computed values, and the per-sample file round trip."""

import json
import math
import re
from fractions import Fraction

import pytest

from rlvr.eval import (
    SampleRow,
    flat_eval_metrics,
    metrics_from_rollouts,
    pass_at_k,
    read_samples,
    summarize,
    write_samples,
)

# --- pass@k ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (8, 3, 1, 3 / 8),  # pass@1 is the fraction correct
        (8, 0, 4, 0.0),  # c = 0
        (8, 8, 4, 1.0),  # c = n
        (8, 1, 8, 1.0),  # k = n with one correct: the single draw holds all samples
        (8, 0, 8, 0.0),  # k = n, none correct
        (8, 5, 4, 1.0),  # n - c < k: every draw of 4 contains a correct one
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_where_binomials_overflow_floats():
    exact = 1 - Fraction(math.comb(190, 100), math.comb(200, 100))
    assert pass_at_k(200, 10, 100) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match=r"pass@5 needs at least k=5 samples per problem, got n=4"):
        pass_at_k(4, 1, 5)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


# --- summarize -------------------------------------------------------------------------

# Three problems, four samples each. Hand values per problem (k = 1, 4):
#   p1: c=2, avg .5,  pass@1 .5,  pass@4 1, maj@1 "3" right, maj@4 tie 3:5 -> "3" (first) right
#   p2: c=1, avg .25, pass@1 .25, pass@4 1, maj@1 "7" wrong, maj@4 "7" (2 votes) wrong
#   p3: c=2, avg .5,  pass@1 .5,  pass@4 1, maj@1 "9" wrong, maj@4 tie 9:4 -> "9" (first) wrong
IDS = ["p1"] * 4 + ["p2"] * 4 + ["p3"] * 4
REWARDS = [1, 0, 1, 0] + [0, 0, 1, 0] + [0, 1, 1, 0]
EXTRACTED = ["3", "5", "3", "5"] + ["7", None, "2", "7"] + ["9", "4", "4", "9"]
REFERENCES = {"p1": "3", "p2": "2", "p3": "4"}


def test_summarize_hand_values():
    s = summarize(IDS, REWARDS, EXTRACTED, REFERENCES, [1, 4])
    assert set(s) == {"avg@1", "avg@4", "pass@1", "pass@4", "maj@1", "maj@4", "n_problems", "stderr", "problems"}
    assert s["n_problems"] == 3
    assert s["avg@1"] == s["avg@4"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)
    assert s["pass@1"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)
    assert s["pass@4"] == 1.0
    assert s["maj@1"] == pytest.approx(1 / 3)
    assert s["maj@4"] == pytest.approx(1 / 3)
    # per-problem avg values .5, .25, .5: s^2 = (2 * (1/12)^2 + (1/6)^2) / 2 = 1/48; se = sqrt(1/144)
    assert s["stderr"]["avg@4"] == pytest.approx(1 / 12)
    assert s["stderr"]["pass@4"] == 0.0
    # maj@4 values 1, 0, 0: s^2 = ((2/3)^2 + 2 * (1/3)^2) / 2 = 1/3; se = sqrt(1/3 / 3) = 1/3
    assert s["stderr"]["maj@4"] == pytest.approx(1 / 3)
    assert set(s["stderr"]) == {"avg@1", "avg@4", "pass@1", "pass@4", "maj@1", "maj@4"}
    assert s["problems"] == [
        {"id": "p1", "n": 4, "c": 2, "mean_reward": 0.5, "majority": "3", "majority_correct": True, "reference": "3"},
        {"id": "p2", "n": 4, "c": 1, "mean_reward": 0.25, "majority": "7", "majority_correct": False, "reference": "2"},
        {"id": "p3", "n": 4, "c": 2, "mean_reward": 0.5, "majority": "9", "majority_correct": False, "reference": "4"},
    ]


def test_maj_judges_the_voted_answer_by_any_sample_with_that_answer():
    # Sample 0 voted "3" but timed out (reward 0); sample 2 shows "3" is right.
    s = summarize(["p"] * 3, [0, 0, 1], ["3", "8", "3"], None, [1])
    assert s["maj@1"] == 1.0
    assert s["pass@1"] == pytest.approx(1 / 3)


def test_maj_without_any_extracted_answer_is_wrong():
    s = summarize(["p"] * 2, [0, 0], [None, None], None, [2])
    assert s["maj@2"] == 0.0 and s["problems"][0]["majority"] is None


def test_single_problem_has_no_stderr():
    s = summarize(["p"] * 2, [1, 0], ["1", "2"], None, [1])
    assert s["stderr"]["avg@1"] is None


def test_summarize_rejects_problems_with_fewer_than_k_samples():
    with pytest.raises(ValueError, match=r"at least 4 samples per problem; 1 problem\(s\) have fewer, e.g. 'q' has 2"):
        summarize(["p"] * 4 + ["q"] * 2, [0] * 6, [None] * 6, None, [1, 4])


def test_summarize_allows_unequal_n_above_k():
    s = summarize(["p"] * 2 + ["q"] * 4, [1, 0, 1, 1, 0, 0], ["a"] * 6, None, [2])
    assert s["pass@2"] == pytest.approx((1.0 + (1 - 1 / 6)) / 2)  # q: 1 - C(2,2)/C(4,2)


@pytest.mark.parametrize("ks", [[], [0], [1.5]])
def test_summarize_rejects_bad_ks(ks):
    with pytest.raises(ValueError, match="k"):
        summarize(["p"], [1], ["a"], None, ks)


def test_summarize_rejects_mismatched_lengths_and_bad_rewards():
    with pytest.raises(ValueError, match="one entry per sample"):
        summarize(["p", "p"], [1], ["a", "a"], None, [1])
    with pytest.raises(ValueError, match="finite number"):
        summarize(["p"], [float("nan")], ["a"], None, [1])


def test_flat_eval_metrics_names():
    flat = flat_eval_metrics(summarize(IDS, REWARDS, EXTRACTED, REFERENCES, [4]), "eval/toy")
    assert flat == {
        "eval/toy/avg@4": pytest.approx(5 / 12),
        "eval/toy/pass@4": 1.0,
        "eval/toy/maj@4": pytest.approx(1 / 3),
        "eval/toy/stderr/avg@4": pytest.approx(1 / 12),
        "eval/toy/stderr/pass@4": 0.0,
        "eval/toy/stderr/maj@4": pytest.approx(1 / 3),
        "eval/toy/n_problems": 3,
    }


# --- sample files ----------------------------------------------------------------------


def _rows():
    return [
        SampleRow(
            problem_id=pid,
            sample=i % 4,
            response=f"... {x}",
            extracted=x,
            reward=float(r),
            status="ok",
            answer=REFERENCES[pid],
        )
        for i, (pid, r, x) in enumerate(zip(IDS, REWARDS, EXTRACTED))
    ]


def test_sample_file_round_trip_gives_the_same_metrics(tmp_path):
    path = write_samples(tmp_path / "eval" / "toy.jsonl", _rows())
    assert read_samples(path) == _rows()
    from_file = metrics_from_rollouts(path, [1, 4])
    assert from_file == summarize(IDS, REWARDS, EXTRACTED, REFERENCES, [1, 4])
    json.dumps(from_file, allow_nan=False)  # the --out file is strict JSON


def test_sample_index_orders_rows_within_a_problem(tmp_path):
    path = tmp_path / "s.jsonl"
    lines = [
        {"problem_id": "p", "sample": 1, "reward": 0, "extracted": "8"},
        {"problem_id": "p", "sample": 0, "reward": 1, "extracted": "3"},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "\n")  # trailing blank line is fine
    assert [r.sample for r in read_samples(path)] == [0, 1]
    assert metrics_from_rollouts(path, [1])["maj@1"] == 1.0


def test_minimal_rows_from_another_tool(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(
        '{"problem_id": 7, "reward": 1, "extracted": "x"}\n{"problem_id": 7, "reward": 0.0, "extracted": null}\n'
    )
    s = metrics_from_rollouts(path, [2])
    assert s["n_problems"] == 1 and s["pass@2"] == 1.0 and s["problems"][0]["id"] == "7"


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"problem_id": "p", "extracted": "a"}', r"s.jsonl:2: missing field 'reward'"),
        (
            '{"problem_id": "p", "reward": "1", "extracted": "a"}',
            r"s.jsonl:2: field 'reward' must be a finite number, got '1'",
        ),
        (
            '{"problem_id": "p", "reward": 1, "extracted": 3}',
            r"s.jsonl:2: field 'extracted' must be a string or null, got 3",
        ),
        (
            '{"problem_id": null, "reward": 1, "extracted": "a"}',
            r"s.jsonl:2: field 'problem_id' must be a string or an integer",
        ),
        (
            '{"problem_id": "p", "reward": 1, "extracted": "a", "sample": 0}',
            r"s.jsonl:2: problem 'p' sample 0 already given on line 1",
        ),
        ('{"problem_id": "p", "reward": 1,', r"s.jsonl:2: not valid JSON"),
        ("[1, 2]", r"s.jsonl:2: expected a JSON object, got list"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, bad_line, message):
    path = tmp_path / "s.jsonl"
    path.write_text('{"problem_id": "p", "sample": 0, "reward": 1, "extracted": "a"}\n' + bad_line + "\n")
    with pytest.raises(ValueError, match=message) as excinfo:
        read_samples(path)
    assert "\n" not in str(excinfo.value)


def test_empty_sample_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no sample rows"):
        read_samples(path)


# --- the eval loop's input checks (they run before any generation) ----------------------


@pytest.mark.parametrize(
    ("n_prompts", "ids", "n", "ks", "message"),
    [
        (1, ["a", "b"], 4, [1], "need one prompt per problem, got 2 problems and 1 prompts"),
        (2, ["a", "a"], 4, [1], "problem ids must be unique, 'a' appears more than once"),
        (2, ["a", "b"], 4, [1, 8], "n=4 samples per problem cannot give @8 metrics; use n >= 8"),
        (2, ["a", "b"], 4, [], "need at least one k"),
    ],
)
def test_evaluate_rejects_bad_inputs_before_generating(n_prompts, ids, n, ks, message):
    from rlvr.eval.runner import evaluate
    from rlvr.records import Problem, Sampling

    problems = [Problem(id=i, question="1+1?", answer="2") for i in ids]
    with pytest.raises(ValueError, match=re.escape(message)):
        # No engine or scorer is needed: the checks fail before either is called.
        evaluate(None, None, problems, [[1, 2, 3]] * n_prompts, n=n, ks=ks, sampling=Sampling())


# --- paired differences ------------------------------------------------------------------


def test_paired_difference_by_hand():
    from rlvr.eval.metrics import paired_difference

    # three problems, two samples each; a fourth problem only the second evaluation scored
    before = (["a", "a", "b", "b", "c", "c"], [0.0, 0.0, 1.0, 0.0, 1.0, 1.0], [None, "1", "2", "3", "4", "4"])
    after = (
        ["a", "a", "b", "b", "c", "c", "d", "d"],
        [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        ["5", "1", "2", "2", "4", "4", "6", "6"],
    )
    paired = paired_difference(before, after, [1, 2])
    assert paired["n_problems"] == 3
    # avg: per problem 0.5, 0.5, 0 -> mean 1/3, sd sqrt(1/12), se sqrt(1/12)/sqrt(3) = 1/6
    assert paired["difference"]["avg@2"] == pytest.approx(1 / 3)
    assert paired["stderr"]["avg@2"] == pytest.approx(1 / 6)
    # pass@2: a 0 -> 1, b 1 -> 1, c 1 -> 1; maj@1 (first sample's answer): a 0 -> 1, b 1 -> 1, c 1 -> 1
    assert paired["difference"]["pass@2"] == pytest.approx(1 / 3) and paired["difference"]["maj@1"] == pytest.approx(
        1 / 3
    )
    # the paired error is the spread of the differences, not of the scores: equal moves give zero
    same = paired_difference(before, (before[0], [r + 0.5 for r in before[1]], before[2]), [1])
    assert same["difference"]["avg@1"] == pytest.approx(0.5) and same["stderr"]["avg@1"] == pytest.approx(0.0)


def test_paired_difference_needs_shared_problems():
    from rlvr.eval.metrics import paired_difference

    with pytest.raises(ValueError, match="share no problem"):
        paired_difference((["a"], [1.0], ["1"]), (["b"], [1.0], ["1"]), [1])
