"""Environments: what a trajectory is, from a dataset row to its reward.

    env = make_env(name, problem, context)        # one instance per trajectory
    messages = env.reset(problem)                  # None: the row's prompt, rendered by data.template
    step = env.step(action)                        # EnvStep(observation, reward, done, tool calls ...)

`single_turn` is rlvr's original path (one completion, scored by the verifier); `calculator`
and `python_tool` let the model call a tool between turns; `code_tests` runs a program against
the row's tests in the sandbox; `skyrl:ID` runs a skyrl-gym environment unchanged.
rlvr.rollout.trajectories drives them over the engine, turn by turn.

The registry lives here, where the loop imports environments, and not in `base`: the
environments import the interface, the interface never imports them.
"""

from collections.abc import Callable

from rlvr.envs.base import EnvContext, Environment, EnvStep
from rlvr.envs.builtin import Calculator, CodeTestsEnv, PythonTool, SingleTurn
from rlvr.envs.skyrl import SkyRLEnv
from rlvr.records import Problem

# name -> factory(problem, context); add one with ENVIRONMENTS[name] = factory.
# `skyrl:ID` names are not listed: any registered skyrl-gym id is accepted.
ENVIRONMENTS: dict[str, Callable[[Problem, EnvContext], Environment]] = {
    "single_turn": SingleTurn,
    "calculator": Calculator,
    "python_tool": PythonTool,
    "code_tests": CodeTestsEnv,
}


def make_env(name: str, problem: Problem, context: EnvContext) -> Environment:
    """A fresh environment for one trajectory of `problem`; the row's own `env` (meta) wins over `name`."""
    name = problem.meta.get("env") or name
    if name.startswith("skyrl:"):
        return SkyRLEnv(name.removeprefix("skyrl:"), problem, context)
    if name not in ENVIRONMENTS:
        raise ValueError(
            f"env.name={name!r} (problem {problem.id!r}): unknown environment; known: "
            f"{', '.join(sorted(ENVIRONMENTS))}, or skyrl:ID for a skyrl-gym environment"
        )
    return ENVIRONMENTS[name](problem, context)


__all__ = ["ENVIRONMENTS", "EnvContext", "EnvStep", "Environment", "make_env"]
