"""vLLM's engine core dead: a call into it fails with `EngineDied`, saying how the core's process
exited; and where the core runs in a process of its own, the calls already waiting on it are woken."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import wait
from threading import Thread
from typing import TYPE_CHECKING, TypeVar

from rlvr.engines.base import EngineDied

if TYPE_CHECKING:
    from vllm import LLM

T = TypeVar("T")  # what a call into vLLM returns


def call_engine(llm: LLM | None, operation: str, fn: Callable[[LLM], T]) -> T:
    """`fn(llm)`, a call into vLLM (`llm` None: the engine was closed), a dead engine turned into an
    error that says so."""
    if llm is None:
        raise RuntimeError(f"vLLM engine is closed: cannot {operation}")
    from vllm.v1.engine.exceptions import EngineDeadError  # vllm: only an engine that runs it imports it

    try:
        return fn(llm)
    except EngineDeadError as error:
        raise EngineDied(
            f"vLLM engine process died ({engine_exit(llm)}) during {operation}; see its log above"
        ) from error


def watch_engine_core(llm: LLM) -> None:
    """Wake calls that wait on an engine core that died.

    vLLM 0.32's client notices the death and fails calls made after it, but a generate
    call already waiting for outputs (or an RPC for its answer) waits forever: the output
    thread exits without a word. This thread hands those waiters vLLM's own EngineDeadError.
    """
    from vllm.v1.engine.exceptions import EngineDeadError  # vllm: only an engine that runs it imports it

    client = llm.llm_engine.engine_core
    resources = getattr(client, "resources", None)  # a client of an engine core in its own process has them
    manager = getattr(resources, "engine_manager", None)
    if manager is None or not hasattr(client, "outputs_queue"):
        return

    def watch(sentinels=tuple(p.sentinel for p in manager.processes)):
        wait(sentinels)  # returns once any engine-core process has exited (or was closed)
        resources.engine_dead = True  # calls from now on fail at once (vLLM's ensure_alive)
        client.outputs_queue.put_nowait(EngineDeadError())
        for future in list(client.utility_results.values()):
            if not future.done():
                future.set_exception(EngineDeadError())

    Thread(target=watch, daemon=True, name="rlvr-engine-core-watch").start()


def engine_exit(llm: LLM) -> str:
    """How the engine core's processes exited, as far as vLLM's client knows."""
    manager = getattr(getattr(llm.llm_engine.engine_core, "resources", None), "engine_manager", None)
    codes = [p.exitcode for p in getattr(manager, "processes", [])]
    return ", ".join(f"exit {c}" for c in codes) or "exit code unknown"
