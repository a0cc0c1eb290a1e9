"""Placement `ray`: the engine and the two trainer ranks as Ray actors, on a Ray this process
starts and on one started beforehand with `ray start --head`. The controller cannot tell: the
same 2-step run gives the same metrics, value for value, as with plain local processes.

As in test_day0, the model is a tiny random one and the reward the share of digits in the
response, so rewards vary, the adapter trains, and the engine must serve the trained one.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from run_fixtures import DIGIT_SHARE, comparable_metrics, metric_differences, small_config, train

from rlvr.config import PlacementConfig
from rlvr.orchestration.ray_placement import bundles, strategy
from rlvr.planning.placement import PlanError, plan_layout

RAY = Path(sys.executable).parent / "ray"


def _bundles(placement: PlacementConfig, ranks: int, engines: int = 1, tp: int = 1):
    """The layout's placement group: its bundles, its strategy, and each rank's and engine's (bundle, CPUs, GPUs)."""
    layout = plan_layout(placement, ranks=ranks, engines=engines, tp=tp)
    return (
        bundles(layout),
        strategy(layout),
        [(s.bundle, s.cpus, s.reserved_gpus) for s in layout.trainers],
        [(s.bundle, s.cpus, s.reserved_gpus) for s in layout.engines],
    )


def test_plan_colocates_the_engine_with_rank_0_and_splits_it_off_on_request():
    local, strategy_, ranks, engines = _bundles(PlacementConfig(backend="ray"), ranks=2)
    assert local == [{"CPU": 1.0}, {"CPU": 1.0}] and strategy_ == "STRICT_PACK"
    assert ranks[0][0] == engines[0][0] == 0 and ranks[0][1] + engines[0][1] <= 1.0

    split = PlacementConfig(backend="ray", colocate=False, nodes=2, gpus_per_node=4, engine_gpus=2)
    assert _bundles(split, ranks=4, tp=2) == (
        [{"CPU": 1.0, "GPU": 2.0}] + [{"CPU": 1.0, "GPU": 1.0}] * 4,
        "PACK",
        [(i, 1.0, 1.0) for i in range(1, 5)],
        [(0, 1.0, 2.0)],
    )


def test_plan_gives_each_engine_replica_a_bundle_of_its_tp_group_or_a_rank_to_share():
    split = _bundles(
        PlacementConfig(backend="ray", colocate=False, nodes=3, gpus_per_node=4, engine_gpus=8),
        ranks=4,
        engines=2,
        tp=4,
    )
    assert split[0] == [{"CPU": 1.0, "GPU": 4.0}] * 2 + [{"CPU": 1.0, "GPU": 1.0}] * 4
    assert split[3] == [(0, 1.0, 4.0), (1, 1.0, 4.0)] and [bundle for bundle, _, _ in split[2]] == [2, 3, 4, 5]
    colocated = _bundles(PlacementConfig(backend="ray", gpus_per_node=2), ranks=2, engines=2)
    assert colocated[3] == colocated[2] == [(0, 0.5, 0.5), (1, 0.5, 0.5)]
    with pytest.raises(
        PlanError, match=r"^placement.engine_gpus=6 must equal engine.replicas x engine.tensor_parallel"
    ):
        plan_layout(
            PlacementConfig(backend="ray", colocate=False, gpus_per_node=8, engine_gpus=6), ranks=2, engines=4, tp=1
        )
    with pytest.raises(PlanError, match=r"^engine.replicas=3: colocated, each engine shares a trainer rank's bundle"):
        plan_layout(PlacementConfig(backend="ray"), ranks=2, engines=3, tp=1)
    with pytest.raises(
        PlanError, match=r"^engine.tensor_parallel_size=2: the engine's slot has 1 GPU\(s\) \(colocated"
    ):
        plan_layout(PlacementConfig(backend="ray", gpus_per_node=2), ranks=2, engines=1, tp=2)

    with pytest.raises(PlanError, match="placement.engine_gpus"):
        plan_layout(PlacementConfig(backend="ray", colocate=False, gpus_per_node=8), ranks=2, engines=1, tp=1)
    with pytest.raises(PlanError, match="need 9 GPUs; nodes=1 x gpus_per_node=8 has 8"):
        plan_layout(
            PlacementConfig(backend="ray", colocate=False, gpus_per_node=8, engine_gpus=1), ranks=8, engines=1, tp=1
        )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("ray")


def _run(workspace: Path, name: str, placement: dict, env: dict | None = None) -> Path:
    """The 2-step run with `placement` (and `env`); the model and task are built by the first run."""
    config = small_config(
        workspace,
        name,
        2,
        reward=DIGIT_SHARE,
        placement=placement,
        trainer={"ranks": 2},
        rollout={"sampling": {"max_tokens": 24}},
        demo={"base_format": "hf", "model": {"num_layers": 2, "intermediate_size": 256}},
    )
    done = train(config, env=env)
    assert done.returncode == 0, done.stdout[-3000:]
    summary = json.loads((workspace / name / "summary.json").read_text())
    assert (summary["engine"], summary["trainer_ranks"]) == ("vllm", 2)
    return workspace / name


@pytest.fixture(scope="module")
def local_metrics(workspace):
    metrics = comparable_metrics(_run(workspace, "local", {"backend": "local"}))
    steps = [line for line in metrics if "reward/mean" in line]
    assert [line["step"] for line in steps] == [1, 2]
    assert all(line["reward/std"] > 0 and line["grad_norm"] > 0 for line in steps)  # the adapter trains
    return metrics


@pytest.mark.slow
def test_two_steps_on_a_ray_started_here_match_local_processes(workspace, local_metrics):
    # A stale address (as a dead `ray start` leaves one) must not be joined: null starts a private Ray.
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}
    metrics = comparable_metrics(_run(workspace, "ray", {"backend": "ray"}, env))
    assert metrics == local_metrics, metric_differences(metrics, local_metrics)


# Ray turns token authentication on for `ray start` once ~/.ray/auth_token exists (a private Ray
# writes it), but a driver joining an explicit address only with RAY_AUTH_MODE=token: one setting
# for both keeps the test independent of what ran before it on the machine.
NO_AUTH = {**os.environ, "RAY_AUTH_MODE": "disabled"}


@contextmanager
def ray_head():
    """`ray start --head` in a temp dir of its own, on a free port; yields its address. Killing its
    process group stops exactly this cluster (`ray stop` would stop every Ray on the machine)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths have a length limit
    head = subprocess.Popen(
        [
            str(RAY),
            "start",
            "--head",
            "--block",
            "--port",
            "0",
            "--temp-dir",
            str(temp_dir),
            "--num-cpus",
            "2",
            "--include-dashboard",
            "false",
            "--disable-usage-stats",
            "--object-store-memory",
            str(500 << 20),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=NO_AUTH,
    )
    address_file = temp_dir / "ray_current_cluster"
    try:
        deadline = time.monotonic() + 120
        while not address_file.exists():
            assert head.poll() is None, head.stdout.read()
            assert time.monotonic() < deadline, "ray start --head did not come up in 120 s"
            time.sleep(0.2)
        yield address_file.read_text().strip()
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_two_steps_on_a_cluster_from_ray_start_match_local_processes(workspace, local_metrics):
    with ray_head() as address:
        metrics = comparable_metrics(_run(workspace, "ray_start", {"backend": "ray", "ray_address": address}, NO_AUTH))
    assert metrics == local_metrics, metric_differences(metrics, local_metrics)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_killed_rank_or_engine_stops_the_run_with_one_line(tmp_path, backend):
    from engine_fixtures import rank_spec, start_engine

    from rlvr.models.tiny import build_tiny_model
    from rlvr.training.trainer import Trainer, TrainerError

    tiny = str(build_tiny_model(tmp_path / "tiny", "qwen2", hidden_size=128, num_layers=2, intermediate_size=256))
    spec = rank_spec(tiny, ranks=2)
    probe = ([[1, 2, 3, 4, 5]], [3])
    if backend == "local":
        with Trainer(spec) as trainer:
            trainer.wait_started()
            ranks = [psutil.Process(rank._process.pid) for rank in trainer._ranks]
            # named for ps, top and the benchmarks; forked from one fork server, not the controller
            assert [rank.name() for rank in ranks] == ["rlvr-rank0", "rlvr-rank1"]
            assert len({rank.ppid() for rank in ranks}) == 1 and ranks[0].ppid() != os.getpid()
            os.kill(ranks[1].pid, signal.SIGKILL)
            with pytest.raises(TrainerError) as died:
                trainer.logprobs(*probe)
        assert str(died.value) == "trainer rank 1 died (exit code -9); the run stops"
        return

    import ray

    from rlvr.orchestration.ray_placement import EngineError, RayCluster

    cluster = RayCluster.shared(PlacementConfig(backend="ray"), ranks=2)
    with (
        Trainer(spec, launch=cluster.launch_ranks) as trainer,
        start_engine("vllm", tiny, placement=cluster, max_model_len=64, kv_cache_gb=0.25) as engine,
    ):
        assert engine.score(*probe)[0] == pytest.approx(trainer.logprobs(*probe)[0], abs=1e-4)
        assert (engine.pending, engine.policy_version) == (0, 0)  # the engine's properties, through the actor
        ray.kill(trainer._ranks[1]._actor)
        with pytest.raises(TrainerError) as rank_died:
            trainer.logprobs(*probe)
        ray.kill(engine._actor)
        with pytest.raises(EngineError) as engine_died:
            engine.score(*probe)
    killed = r"\(Ray actor, pid \d+ on [\d.]+: .*killed by `ray.kill`.*\)"
    assert rank_died.match(rf"^trainer rank 1 died {killed}; the run stops$")
    assert engine_died.match(rf"^the engine actor died {killed} during score; the run stops$")
    assert "\n" not in str(rank_died.value) + str(engine_died.value)
    assert not ray.is_initialized()  # the last actor closed took the cluster down with it
