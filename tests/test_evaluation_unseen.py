"""The held-out figures on test problems never drawn for training: which problems, and their metrics."""

from __future__ import annotations

from rlvr.config import RunConfig
from rlvr.eval.rollouts_file import SampleRow, read_samples, summarize_rows, write_samples
from rlvr.orchestration.evaluation import Evaluation
from rlvr.records import Problem
from rlvr.rollout.prompts import PromptSet
from rlvr.rollout.sampler import EpochSampler
from rlvr.tracking.timing import StepTimer


def test_drawn_is_every_index_taken_so_far_and_all_after_an_epoch():
    sampler = EpochSampler(10, seed=3)
    taken = set(sampler.take(4))
    assert sampler.drawn() == taken and len(taken) == 4
    sampler.take(7)  # into the second epoch
    assert sampler.drawn() == set(range(10))
    assert EpochSampler(10, seed=3).drawn() == set()


def _prompt_set(prompts: list[list[int]], prefix: str) -> PromptSet:
    return PromptSet([Problem(id=f"{prefix}{i}", question="q", answer="1") for i in range(len(prompts))], prompts)


def test_after_evaluation_reports_before_and_after_on_the_test_problems_never_drawn(tmp_path):
    cfg = RunConfig.model_validate(
        {"run_dir": str(tmp_path), "model": {"path": "m"}, "data": {"train": "t"}, "eval": {"n": 2, "k": [1, 2]}}
    )
    test = _prompt_set([[1], [2], [3], [4], [5]], "t")
    train = _prompt_set([[2], [9], [3], [8], [7], [6]], "r")  # test problems t1 and t2 also occur in data.train
    sampler = EpochSampler(len(train.problems), seed=0)
    drawn = {tuple(train.prompts[i]) for i in sampler.take(3)}
    evaluation = Evaluation(cfg, None, None, test, StepTimer(), log=lambda line: None, train_set=train, sampler=sampler)
    rewards = {"before": [0, 0, 1, 0, 0, 0, 0, 1, 0, 0], "after": [1, 1, 1, 0, 1, 1, 0, 1, 1, 0]}
    rows = {
        when: [
            SampleRow(problem_id=f"t{i // 2}", reward=r, extracted=str(r), sample=i % 2, answer="1")
            for i, r in enumerate(values)
        ]
        for when, values in rewards.items()
    }
    for when, when_rows in rows.items():
        write_samples(tmp_path / "eval" / f"{when}.jsonl", when_rows)

    unseen = evaluation._unseen(evaluation._saved_rows())

    ids = {p.id for p, prompt in zip(test.problems, test.prompts) if tuple(prompt) not in drawn}
    assert 3 <= len(ids) < 5  # the draw took at least one of t1, t2
    for when in ("before", "after"):
        expected = summarize_rows([r for r in rows[when] if r.problem_id in ids], [1, 2])
        assert unseen[when]["n_problems"] == len(ids)
        assert unseen[when]["avg@2"] == expected["avg@2"] and unseen[when]["stderr"] == expected["stderr"]


def test_the_headline_of_a_single_unseen_problem_has_no_standard_error(tmp_path):
    """One test problem never drawn: no standard error (it needs two), and the log line says so
    by leaving it out (it crashed on formatting None at the end of such a run)."""
    cfg = RunConfig.model_validate(
        {"run_dir": str(tmp_path), "model": {"path": "m"}, "data": {"train": "t"}, "eval": {"n": 1, "k": [1]}}
    )
    test = _prompt_set([[1], [2]], "t")
    train = _prompt_set([[1]], "r")  # t0 is drawn at once; t1 never is
    sampler = EpochSampler(len(train.problems), seed=0)
    sampler.take(1)
    lines = []
    evaluation = Evaluation(cfg, None, None, test, StepTimer(), log=lines.append, train_set=train, sampler=sampler)
    rows = [
        SampleRow(problem_id=f"t{i}", reward=r, extracted=str(r), sample=0, answer="1") for i, r in enumerate([1, 0])
    ]
    for when in ("before", "after"):
        write_samples(tmp_path / "eval" / f"{when}.jsonl", rows)
    result = summarize_rows(rows, [1]) | {"unseen": evaluation._unseen(evaluation._saved_rows())}
    assert result["unseen"]["after"]["n_problems"] == 1 and result["unseen"]["after"]["stderr"]["avg@1"] is None
    headline = evaluation._headline("after", result)
    assert headline["unseen_after/avg@1"] == 0.0
    assert lines[-1] == "  on the 1 test problems never drawn for training: avg@1 0.000 -> 0.000"


def test_the_after_evaluation_pairs_its_problems_with_the_before_one(tmp_path):
    """after - before per problem, from the two sample files: the headline's paired/* figures
    and the log line the run ends with."""
    cfg = RunConfig.model_validate(
        {"run_dir": str(tmp_path), "model": {"path": "m"}, "data": {"train": "t"}, "eval": {"n": 2, "k": [2]}}
    )
    lines = []
    evaluation = Evaluation(cfg, None, None, _prompt_set([[1], [2], [3]], "t"), StepTimer(), log=lines.append)
    rewards = {"before": [0, 0, 1, 0, 1, 1], "after": [1, 0, 1, 1, 1, 1]}  # per problem +0.5, +0.5, 0
    for when, values in rewards.items():
        write_samples(
            tmp_path / "eval" / f"{when}.jsonl",
            [
                SampleRow(problem_id=f"t{i // 2}", reward=r, extracted=str(r), sample=i % 2, answer="1")
                for i, r in enumerate(values)
            ],
        )
    after = read_samples(tmp_path / "eval" / "after.jsonl")
    result = summarize_rows(after, [2]) | {"paired": evaluation._paired(evaluation._saved_rows())}
    headline = evaluation._headline("after", result)
    assert headline["paired/avg@2"] == round(1 / 3, 4) and headline["paired/stderr/avg@2"] == round(1 / 6, 4)
    assert lines[-1].startswith("  after - before, paired over the same 3 problems: avg@2 +0.333 ± 0.167")
