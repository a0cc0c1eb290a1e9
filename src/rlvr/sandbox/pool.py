"""SandboxPool: many sandboxed programs at once, each in a fresh sandbox (`runner.Sandbox`).

Threads only wait here: every program runs in its own process tree, so `workers` threads
keep `workers` sandboxes busy. Futures let a caller (an environment, a verifier's batch)
collect results as they finish; `asyncio.wrap_future` turns them into awaitables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from rlvr.config import SandboxConfig
from rlvr.sandbox.runner import Sandbox, SandboxResult


class SandboxPool:
    """Runs programs `config.workers` at a time; construction refuses like `Sandbox`.

    >>> with SandboxPool() as pool:
    ...     pool.run("print(6 * 7)").stdout
    '42\\n'
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.sandbox = Sandbox(config)
        self.config = self.sandbox.config
        self._executor = ThreadPoolExecutor(self.config.workers, thread_name_prefix="sandbox")

    @property
    def isolation(self) -> str:
        return self.sandbox.isolation

    def submit(
        self, source: str, *, stdin: bytes = b"", files: Mapping[str, str | bytes] | None = None
    ) -> Future[SandboxResult]:
        """Start `source` (as main.py, with `files` and `stdin`) when a worker is free."""
        return self._executor.submit(self.sandbox.run, source, stdin=stdin, files=files)

    def run(self, source: str, *, stdin: bytes = b"", files: Mapping[str, str | bytes] | None = None) -> SandboxResult:
        return self.submit(source, stdin=stdin, files=files).result()

    def map(self, sources: Iterable[str]) -> list[SandboxResult]:
        """Each source run once, results in order."""
        return [future.result() for future in [self.submit(source) for source in sources]]

    def close(self) -> None:
        """Wait for running programs (each ends by its wall-clock limit) and stop the workers."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
