"""The environment interface: what an environment answers, and what environments share in a run.

An environment sees the model's text (an action) and answers with messages (an observation),
a reward and whether the trajectory is done, as skyrl-gym's BaseTextEnv, verifiers' MultiTurnEnv
and TRL's environment_factory do. A reward of None leaves the trajectory's reward to the run's
verifier, applied to the last action in the scoring pool, as single-turn RLVR always did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rlvr.config import EnvConfig, SandboxConfig
from rlvr.records import Problem

Messages = list[dict[str, str]]  # OpenAI-format chat messages


@dataclass
class EnvStep:
    observation: Messages = field(default_factory=list)  # appended before the model's next turn; [] when done
    reward: float | None = None  # None: the verifier scores the last action
    done: bool = True
    tool_calls: int = 0  # tools the action called
    tool_errors: int = 0  # of which failed (an exception, a timeout, a refused call)


class Environment(Protocol):
    def reset(self, problem: Problem) -> Messages | None:
        """The conversation the model starts from; None: the row's own prompt (data.template)."""
        ...

    def step(self, action: str) -> EnvStep:
        """The model's turn, as text; what follows it."""
        ...

    def close(self) -> None: ...


@dataclass
class EnvContext:
    """What environments share within a run: their config and the code sandbox (started on first use)."""

    config: EnvConfig
    sandbox: SandboxConfig
    _pool: object = None

    def sandbox_pool(self):
        from rlvr.sandbox import SandboxPool

        if self._pool is None:
            self._pool = SandboxPool(self.sandbox)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
