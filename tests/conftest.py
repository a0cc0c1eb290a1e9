"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `--dist loadgroup`).

- A file's tests stay on one worker, so the engines, models and runs it shares through module
  fixtures are built once, as in a serial run.
- The files that start Ray clusters share one worker: two clusters never compete for the cores
  and memory at once.
- Files with slow tests are handed out first, the most slow tests first, so the run does not end
  with one worker still on a long file while the other idles.
- Tests marked `solo` read machine-wide state (every process of a uid, every cgroup) or bound a
  wall-clock time; `make test` runs them afterwards, alone.

A plain `pytest` (no `-n`) runs everything in one process, in the usual order, as before.
"""

import pytest

RAY_FILES = {"test_ray.py", "test_rehearsal.py", "test_engine_replicas.py"}


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.has_plugin("xdist") or not config.getoption("dist", "no") == "loadgroup":
        return
    group_of = {}
    for item in items:
        group_of[item] = "ray" if item.path.name in RAY_FILES else item.path.name
        item.add_marker(pytest.mark.xdist_group(group_of[item]))
    slow_tests = {}
    for item in items:
        slow_tests[group_of[item]] = slow_tests.get(group_of[item], 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow_tests[group_of[item]])  # stable: each file keeps its own order
