"""The environment interface and its registry.

An environment sees the model's text (an action) and answers with messages (an observation),
a reward and whether the trajectory is done, as skyrl-gym's BaseTextEnv, verifiers' MultiTurnEnv
and TRL's environment_factory do. A reward of None leaves the trajectory's reward to the run's
verifier, applied to the last action in the scoring pool, as single-turn RLVR always did.
"""

from __future__ import annotations

from collections.abc import Callable
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


# name -> factory(problem, context); `skyrl:ID` names are resolved by rlvr.envs.skyrl
ENVIRONMENTS: dict[str, Callable[[Problem, EnvContext], Environment]] = {}


def register(name: str):
    def add(factory):
        ENVIRONMENTS[name] = factory
        return factory

    return add


def make_env(name: str, problem: Problem, context: EnvContext) -> Environment:
    """A fresh environment for one trajectory of `problem`; the row's own `env` (meta) wins over `name`."""
    import rlvr.envs.builtin  # noqa: F401  (registers the built-in environments)

    name = problem.meta.get("env") or name
    if name.startswith("skyrl:"):
        from rlvr.envs.skyrl import SkyRLEnv

        return SkyRLEnv(name.removeprefix("skyrl:"), problem, context)
    if name not in ENVIRONMENTS:
        raise ValueError(f"env.name={name!r} (problem {problem.id!r}): unknown environment; known: "
                         f"{', '.join(sorted(ENVIRONMENTS))}, or skyrl:ID for a skyrl-gym environment")
    return ENVIRONMENTS[name](problem, context)
