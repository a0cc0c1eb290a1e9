"""The split placement on one CPU machine (placement.engine_cpus): which cores the controller with
its engine and each trainer rank get, the warning where threads outnumber cores, and a real run's
processes on the cores it planned, as the kernel reports them."""

import json
import os
import threading
from contextlib import ExitStack
from pathlib import Path

import pytest
from run_fixtures import DIGIT_SHARE, small_config, train

from rlvr.affinity import allowed_cores, core_list, pinned, process_cores
from rlvr.config import ConfigError, load_config
from rlvr.orchestration.builders import place_on_cores
from rlvr.planning.cpu_split import cpu_split
from rlvr.planning.sections import PlanSections

DEMO = "configs/demo.yaml"
SPLIT = ["placement.colocate=false", "engine.num_threads=null"]


def split_of(cores: int, *overrides: str):
    return cpu_split(PlanSections.of(load_config(DEMO, list(overrides))), list(range(cores)))


def test_the_engine_takes_the_first_cores_and_each_rank_a_share_of_the_rest():
    split = split_of(8, *SPLIT, "placement.engine_cpus=2", "trainer.ranks=3")
    assert split.split and split.controller == [0, 1] and split.engine_threads == 2
    assert split.ranks == [[2, 3], [4, 5], [6, 7]] and split.rank_threads == 2
    assert split.warning is None
    assert split.describe() == (
        "cores: split (placement.engine_cpus): controller + engine on cores 0-1, 2 threads; "
        "trainer rank 0 on cores 2-3, trainer rank 1 on cores 4-5, trainer rank 2 on cores 6-7, "
        "2 threads each"
    )


def test_ranks_that_do_not_divide_their_cores_share_them_with_a_thread_per_core_between_them():
    split = split_of(6, *SPLIT, "placement.engine_cpus=1", "trainer.ranks=2")
    assert split.ranks == [[1, 2, 3, 4, 5]] * 2 and split.rank_threads == 2 and split.warning is None


def test_one_engine_core_and_one_rank_core_on_a_two_core_machine():
    split = split_of(2, *SPLIT, "placement.engine_cpus=1", "trainer.ranks=1")
    assert (split.controller, split.ranks, split.engine_threads, split.rank_threads) == ([0], [[1]], 1, 1)
    assert split.warning is None


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            ["placement.engine_cpus=2", "trainer.ranks=1"],
            "placement.engine_cpus=2 leaves none of the 2 cores this run may use (0-1) to the trainer ranks, which share the engine's",
        ),
        (["placement.engine_cpus=1", "trainer.ranks=2"], "trainer.ranks=2 (2 threads) on 1 core (1)"),
        (
            ["placement.engine_cpus=1", "trainer.ranks=1", "engine.num_threads=2"],
            "engine.num_threads=2 on the engine's 1 core",
        ),
    ],
)
def test_a_split_with_more_threads_than_cores_says_so_in_one_line(overrides, says):
    warning = split_of(2, *SPLIT, *overrides).warning
    assert warning.startswith("cores oversubscribed: ") and says in warning and "\n" not in warning


def test_unsplit_the_engine_and_the_ranks_are_oversubscribed_only_where_they_run_at_once():
    together = ["rollout.mode=async", "rollout.max_staleness=2"]
    assert "(rollout.mode: async) on 2 cores" in split_of(2, *together).warning  # the engine's 2 threads + 2 ranks
    assert split_of(2).warning is None  # synchronous: the engine and the ranks take turns
    # a rank's threads fill the cores as they are (the Trainer's own count), so any engine thread beside them is one too many
    unsplit = split_of(2, *together, "engine.num_threads=1", "trainer.ranks=1")
    assert not unsplit.split and unsplit.ranks == [[0, 1]] and unsplit.rank_threads == 2
    assert "the engine's 1 thread and trainer.ranks=1 x 2 run at once" in unsplit.warning


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            ["placement.engine_cpus=1"],
            "placement.engine_cpus: gives the engine cores of its own, a split placement: it needs "
            "placement.colocate: false (got 1)",
        ),
        (
            ["placement.colocate=false", "placement.gpus_per_node=2", "placement.engine_cpus=1"],
            "placement.engine_cpus: splits a CPU machine's cores; with GPUs the split is placement.engine_gpus (got 1)",
        ),
        (
            ["placement.colocate=false", "placement.backend=ray", "placement.engine_cpus=1"],
            "placement.engine_cpus: splits the cores of the local backend's processes",
        ),
    ],
)
def test_engine_cpus_outside_a_split_cpu_placement_is_refused_in_one_line(overrides, says):
    with pytest.raises(ConfigError) as error:
        load_config(DEMO, overrides)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_run_says_once_that_its_cores_are_oversubscribed_and_pins_nothing_unsplit():
    said = []
    before = process_cores()
    cores = allowed_cores()
    cfg = load_config(DEMO, ["rollout.mode=async", "rollout.max_staleness=2", f"trainer.ranks={len(cores)}"])
    with ExitStack() as stack:
        place_on_cores(cfg, None, stack, said.append)
        assert process_cores() == before
    assert len(said) == 1 and said[0].startswith("warning: cores oversubscribed: ")


def test_pinned_moves_every_thread_and_gives_the_cores_back():
    cores = allowed_cores()
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    started, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait()))
    worker.start()  # before the pinning: it must move too
    started.wait()
    try:
        with pinned(cores[:1]):
            assert process_cores() == cores[:1]
            assert os.sched_getaffinity(worker.native_id) == {cores[0]}
        assert process_cores() == cores and os.sched_getaffinity(worker.native_id) == set(cores)
    finally:
        stop.set()
        worker.join()


def test_core_list_is_written_as_linux_writes_it():
    assert core_list([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
    assert core_list([5]) == "5"


@pytest.mark.slow
def test_a_split_run_keeps_the_engine_and_the_rank_on_their_own_cores(tmp_path: Path):
    """One step, vLLM in the controller, one rank: by the run's end every thread of the controller
    (vLLM's and torch's included) may run only on the engine's core, and every thread of the rank
    only on the others, each computing with a thread per core."""
    cores = allowed_cores()
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    config = small_config(
        tmp_path,
        "split",
        1,
        reward=DIGIT_SHARE,
        engine={"num_threads": None},
        placement={"colocate": False, "engine_cpus": 1},
    )
    done = train(config)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "oversubscribed" not in done.stdout
    used = json.loads((tmp_path / "split" / "summary.json").read_text())["cores"]
    assert used["split"] is True
    assert used["controller"] == {"cores": cores[:1], "threads": 1}
    assert used["ranks"] == [{"cores": cores[1:], "threads": len(cores) - 1}]
