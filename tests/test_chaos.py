"""The counting and the setting of benchmarks/chaos.py: the chain of the steps' group draw ranges
(lost and duplicated groups), the fault schedule, and the rows it scores in the sandbox."""

import json
import random
import sys
from pathlib import Path

import pytest

from rlvr.rewards import get_verifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import chaos  # noqa: E402


def rows(*ranges):
    return [{"step": step, "rollout/groups_from": a, "rollout/groups_to": b} for step, (a, b) in enumerate(ranges, 1)]


@pytest.mark.parametrize(
    "ranges, lost, duplicated, drawn",
    [
        ([(0, 16), (16, 32), (32, 50)], 0, 0, 50),  # a chain from 0, the last step drew 2 stale extra
        ([(0, 16), (20, 36)], 4, 0, 36),  # 16-19 handed out by no step
        ([(0, 16), (12, 28)], 0, 4, 28),  # 12-15 handed out twice
        ([(4, 20)], 4, 0, 20),  # the chain must start at 0
        ([(0, 16), (10, 26), (30, 46)], 4, 6, 46),
        ([(0, 32), (8, 16), (32, 48)], 0, 8, 48),  # a range inside what was handed out already
    ],
)
def test_group_chain_counts_gaps_as_lost_and_overlaps_as_duplicated(ranges, lost, duplicated, drawn):
    assert chaos.group_chain(rows(*ranges)) == {
        "lost_groups": lost,
        "duplicated_groups": duplicated,
        "groups_drawn": drawn,
    }


def test_group_chain_reads_the_steps_in_order():
    shuffled = rows((0, 16), (16, 32), (32, 48))[::-1]
    assert chaos.group_chain(shuffled)["lost_groups"] == 0


def test_schedule_is_seeded_one_fault_per_kind_after_distinct_steps_clear_of_the_end():
    faults = chaos.schedule(random.Random(0), 40, list(chaos.FAULT_KINDS))
    assert sorted(f.kind for f in faults) == sorted(chaos.FAULT_KINDS)
    steps = [f.after_step for f in faults]
    assert steps == sorted(steps) and len(set(steps)) == len(steps) and min(steps) >= 2 and max(steps) <= 36
    assert faults == chaos.schedule(random.Random(0), 40, list(chaos.FAULT_KINDS))
    assert steps != [f.after_step for f in chaos.schedule(random.Random(1), 40, list(chaos.FAULT_KINDS))]


def test_a_share_of_the_rows_is_scored_in_the_sandbox_as_the_math_verifier_scores_it(tmp_path):
    train = tmp_path / "demo_train.jsonl"
    train.write_text("".join(json.dumps({"problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n" for i in range(9)))
    written = [json.loads(line) for line in chaos.sandboxed_task(tmp_path, train).read_text().splitlines()]
    named = [row.get("verifier") for row in written]
    assert named[:: chaos.SANDBOX_SHARE] == [f"{tmp_path / 'sandboxed_math.py'}:sandboxed_math"] * 3
    assert sum(v is not None for v in named) == 3
    sandboxed, math = get_verifier(named[0]), get_verifier("math")
    for response in ("so \\boxed{12}", "so \\boxed{13}", "no box"):
        ours, reference = sandboxed(response, "12"), math(response, "12")
        assert (ours.reward, ours.extracted) == (reference.reward, reference.extracted)
    assert sandboxed("so \\boxed{13}", "12").detail.startswith(
        "tests: AssertionError"
    )  # the verdict came from the sandbox
