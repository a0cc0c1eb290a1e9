"""A rank's train report and how the ranks' reports add up into a step's metrics."""

import pickle

import pytest
import torch

from rlvr.training.report import RoutingSums, TrainReport, step_metrics


def _report(tokens: float, entropy: float, gap: float, **extra) -> TrainReport:
    report = TrainReport(
        loss=0.5 * tokens,
        tokens=tokens,
        entropy_sum=entropy,
        sampler_gap_sum=gap,
        grad_norm=2.0,
        skipped=1.0,
        updates=3.0,
        lr=1e-4,
        seconds=tokens / 10,
        **extra,
    )
    return report


def test_sums_over_ranks_are_means_over_all_their_tokens():
    first, second = _report(30, 6.0, 0.3), _report(10, 4.0, 0.1)
    first.add_policy("clip_fraction", 3.0)
    second.add_policy("clip_fraction", 1.0)
    metrics = step_metrics([first, second])
    assert metrics["policy/entropy"] == pytest.approx(10.0 / 40)
    assert metrics["sync/sampler_trainer_gap"] == pytest.approx(0.4 / 40)
    assert metrics["policy/clip_fraction"] == pytest.approx(4.0 / 40)
    assert metrics["loss"] == pytest.approx(20.0)  # each rank's part of the mean update's loss
    assert metrics["time/train"] == pytest.approx(3.0)  # the slowest rank
    assert (metrics["grad_norm"], metrics["optimizer/steps"], metrics["lr"]) == (2.0, 2.0, 1e-4)


def test_a_sum_no_rank_reports_gives_no_metric():
    metrics = step_metrics([_report(5, 1.0, 0.1), _report(0, 0.0, 0.0)])
    assert not any(key.startswith(("moe/", "policy/clip", "policy/is_")) for key in metrics)
    assert "policy/approx_kl" not in metrics


def test_several_updates_report_how_far_they_moved():
    report = _report(4, 1.0, 0.1, approx_kl_after_sum=0.2, approx_kl_after_tokens=4.0)
    report.add_policy("approx_kl", 0.8)  # the per-micro-batch estimate, overridden by the measured one
    assert step_metrics([report])["policy/approx_kl"] == pytest.approx(0.05)


def test_routing_adds_up_only_over_ranks_that_measured_it():
    measured = _report(4, 1.0, 0.1)
    measured.add_routing(RoutingSums(6, 8, torch.tensor([[3.0, 1.0]]), 0.4, 0.8, 4.0))
    measured.add_routing(RoutingSums(2, 8, torch.tensor([[1.0, 3.0]]), 0.0, 0.4, 4.0))
    metrics = step_metrics([measured, _report(0, 0.0, 0.0)])
    assert metrics["moe/routing_agreement"] == pytest.approx(0.5)
    assert metrics["moe/sampler_trainer_gap_replay"] == pytest.approx(0.05)
    assert metrics["moe/sampler_trainer_gap_no_replay"] == pytest.approx(0.15)
    assert metrics["moe/expert_load_max_over_mean"] == pytest.approx(1.0)  # 4 and 4 tokens: even


def test_a_name_one_side_does_not_know_is_an_error():
    report = TrainReport()
    with pytest.raises(KeyError, match="not a policy sum"):
        report.add_policy("clip_fraktion", 1.0)
    with pytest.raises(AttributeError):
        report.entropy = 1.0  # not a field: slots refuse it rather than drop it


def test_a_report_crosses_a_process_boundary_whole():
    report = _report(3, 1.0, 0.2)
    report.add_routing(RoutingSums(1, 2, torch.ones(2, 3), 0.1, 0.2, 3.0))
    again = pickle.loads(pickle.dumps(report))
    assert step_metrics([again]).keys() == step_metrics([report]).keys()
    assert torch.equal(again.routing.expert_counts, report.routing.expert_counts)
