"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `-n N --dist loadfile`).

- A file's tests stay on one worker, so the engines, models and runs it shares through module
  fixtures are built once, as in a serial run.
- The files that start Ray clusters share one worker: two clusters never compete for the cores
  and memory at once.
- Files with slow tests are handed out first, the most slow tests first, so the run does not end
  with one worker still on a long file while the other idles.
- Tests marked `solo` read machine-wide state (every process of a uid, every cgroup) or bound a
  wall-clock time; `make test` runs them afterwards, alone.

The grouping is a scheduler of its own rather than xdist_group marks: xdist (3.8) turns those
marks into groups by rewriting each item's node id, which pytest 9.2's items no longer take, so
the marks grouped nothing and a file's module fixtures were built on every worker that ran one
of its tests.

A plain `pytest` (no `-n`) runs everything in one process, in the usual order.
"""

import sys
from pathlib import Path, PurePosixPath

import pytest

from rlvr.models.transformers_classes import register_mistral4

# bitsandbytes, which tests/test_quant_nf4.py checks rlvr's NF4 against, is installed off the
# venv's import path (requirements/cpu.txt says why): the tests' own processes see it, the runs
# they start do not.
PEERS = Path(sys.prefix) / "peers"
if PEERS.is_dir():
    sys.path.append(str(PEERS))

# The tests also build mistral4 models with transformers' own classes; rlvr's code builds them
# through rlvr.models.transformers_classes, which registers the class first.
register_mistral4()

RAY_FILES = {"test_ray.py", "test_rehearsal.py", "test_engine_replicas.py"}


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "ray" if PurePosixPath(path).name in RAY_FILES else path


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """On the controller: `--dist loadfile`, with the Ray files as one group."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """On each worker (xdist hands out groups in the order the workers collected them): the groups
    with the most slow tests first."""
    if not hasattr(config, "workerinput"):
        return
    slow_tests: dict[str, int] = {}
    for item in items:
        group = _group(item.nodeid)
        slow_tests[group] = slow_tests.get(group, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow_tests[_group(item.nodeid)])  # stable: each file keeps its own order
