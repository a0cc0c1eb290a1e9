"""skyrl-gym environments, unchanged, behind rlvr's interface (`env.name: skyrl:ID`).

skyrl-gym (SkyRL's environment library, PyPI `skyrl-gym`) environments take the reference in
`extras["reward_spec"]["ground_truth"]`, start from OpenAI-format messages (`init`) and answer
each action with `{observations, reward, done, metadata}` (`step`). This adapter builds one per
trajectory with the row's answer and metadata, sums its per-turn rewards into the trajectory's
reward, and runs its Python tool (PythonCodeExecutorToolGroup, which would run model code with a
plain `python -c` on this machine) in rlvr's sandbox instead.
"""

from __future__ import annotations

from rlvr.envs.base import EnvContext, EnvStep
from rlvr.records import Problem


class SkyRLEnv:
    stop: tuple[str, ...] = ()

    def __init__(self, env_id: str, problem: Problem, context: EnvContext):
        try:
            import skyrl_gym
            from omegaconf import OmegaConf
        except ImportError:
            raise ValueError(
                f"env.name=skyrl:{env_id}: needs the skyrl-gym package (pip install 'rlvr[envs]')"
            ) from None
        if env_id not in skyrl_gym.registry:
            raise ValueError(
                f"env.name=skyrl:{env_id}: not a skyrl-gym environment; registered: "
                f"{', '.join(sorted(skyrl_gym.registry))}"
            )
        extras = {
            "reward_spec": {"method": "rule", "ground_truth": problem.answer},
            "extra_info": dict(problem.meta),
            "max_turns": context.config.max_turns,
        }
        self.env = skyrl_gym.make(env_id, env_config=OmegaConf.create(dict(context.config.options)), extras=extras)
        self._sandbox_python_tools(context)

    def reset(self, problem: Problem):
        messages = getattr(problem, "messages", None) or [{"role": "user", "content": problem.question}]
        prompt, _ = self.env.init([dict(m) for m in messages])
        return prompt

    def step(self, action: str) -> EnvStep:
        calls, errors = self._tool_calls, self._tool_errors
        out = self.env.step(action)
        observation = [{"role": m["role"], "content": m["content"]} for m in out.get("observations") or []]
        return EnvStep(
            observation,
            reward=float(out["reward"]),
            done=bool(out["done"]),
            tool_calls=self._tool_calls - calls,
            tool_errors=self._tool_errors - errors,
        )

    def close(self) -> None:
        self.env.close()

    def _sandbox_python_tools(self, context: EnvContext) -> None:
        """Point every PythonCodeExecutorToolGroup of the environment at rlvr's sandbox (its
        output in the tool's own words: stdout, or "Error executing Python code: ...")."""
        from skyrl_gym.tools import PythonCodeExecutorToolGroup

        self._tool_calls = self._tool_errors = 0

        def python(code: str) -> str:
            self._tool_calls += 1
            result = context.sandbox_pool().run(code)
            if result.status != "ok" or result.stderr.strip():
                self._tool_errors += 1
                why = result.stderr.strip() or f"{result.status} ({', '.join(result.limits) or 'no output'})"
                return f"Error executing Python code: {why}"
            return result.stdout.strip()

        for group in getattr(self.env, "tool_groups", []):
            if isinstance(group, PythonCodeExecutorToolGroup):
                group._tool_registry["python"] = python  # the registry its execute_tool reads
