"""Isolated execution of untrusted (model-written) Python programs.

Every program runs in a fresh process tree: no network, its own PIDs, read-only files but a
private /tmp, CPU-time, wall-clock, memory, process-count and output limits, and nothing left
once it ends (`isolation.py` lists the layers, `runner.py` the run's rules). rlvr itself never
imports or executes such code: the controller, the trainer ranks and the scoring workers
hand it to a sandbox.

    with SandboxPool(SandboxConfig(wall_s=5)) as pool:
        result = pool.run("print(sum(range(10)))")   # SandboxResult(status="ok", stdout="45\\n", ...)

Where the isolation asked for cannot be had, construction raises SandboxUnavailable with
one line; `isolation="weak"` runs anyway and names what is missing in every result.
"""

from rlvr.sandbox.isolation import SandboxUnavailable
from rlvr.sandbox.pool import SandboxPool
from rlvr.sandbox.runner import Sandbox, SandboxResult

__all__ = ["Sandbox", "SandboxPool", "SandboxResult", "SandboxUnavailable"]
