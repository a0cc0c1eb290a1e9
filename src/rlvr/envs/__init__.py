"""Environments: what a trajectory is, from a dataset row to its reward.

    env = make_env(name, problem, context)        # one instance per trajectory
    messages = env.reset(problem)                  # None: the row's prompt, rendered by data.template
    step = env.step(action)                        # EnvStep(observation, reward, done, tool calls ...)

`single_turn` is rlvr's original path (one completion, scored by the verifier); `calculator`
and `python_tool` let the model call a tool between turns; `code_tests` runs a program against
the row's tests in the sandbox; `skyrl:ID` runs a skyrl-gym environment unchanged.
rlvr.rollout.trajectories drives them over the engine, turn by turn.
"""

from rlvr.envs.base import ENVIRONMENTS, Environment, EnvContext, EnvStep, make_env

__all__ = ["ENVIRONMENTS", "EnvContext", "EnvStep", "Environment", "make_env"]
