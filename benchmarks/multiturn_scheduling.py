"""Multi-turn rollouts: continuous scheduling (a trajectory's next turn goes to the engine as soon as
its environment answers) against lockstep (every next turn waits for the whole batch), side by side,
and the fixed order fully asynchronous runs use (an answer is taken `env.answer_lag_steps` engine
steps after its turn ended, or when the engine runs out of work, so that a seed fixes which policy
version samples which token): what that costs. `--lag` sets those steps.

The environment is a stand-in for a tool with latency: each step takes a random U(0, --latency)
seconds (a sandboxed program, a search call) and asks for another turn, for --turns turns. The
model is the demo's tiny Qwen2 with random weights, served by vLLM (in-process, as training runs
it); the same seeded requests in both modes, alternating A B A B over --rounds rounds.

    python benchmarks/multiturn_scheduling.py --out runs/bench_multiturn.json

Appends a line to docs/benchmarks.md (command, machine, date, figures).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import string
import tempfile
import time
from pathlib import Path

from _ledger import append_line, provenance, write_result

from rlvr.config import DataConfig, EngineConfig, EnvConfig, ModelConfig, SandboxConfig
from rlvr.engines import make_engine
from rlvr.envs import ENVIRONMENTS, EnvContext, EnvStep
from rlvr.models.folder import read_model_folder
from rlvr.models.tiny import build_tiny_model
from rlvr.records import Problem, Sampling
from rlvr.rollout.prompts import Renderer
from rlvr.rollout.trajectories import Start, TrajectoryRunner

MAX_MODEL_LEN = 2048  # room for --turns turns of --max-tokens plus the observations
MODES = ("continuous", "fixed", "lockstep")
_INSTANCES = itertools.count()


class SlowTool:
    """Answers every turn after a random delay, like a tool call, and asks for another turn."""

    # the random model's bytes: a turn ends at its first letter or digit (a turn cut at max_tokens
    # would end its trajectory, and most would then take one turn)
    stop: tuple[str, ...] = tuple(string.ascii_letters + string.digits)

    def __init__(self, problem: Problem, context: EnvContext):
        self.latency = float(context.config.options["latency"])
        self.rng = random.Random(f"{problem.id}-{next(_INSTANCES)}")

    def reset(self, problem):
        return None

    def step(self, action: str) -> EnvStep:
        time.sleep(self.rng.uniform(0.0, self.latency))
        return EnvStep([{"role": "user", "content": "go on"}], done=False, tool_calls=1)

    def close(self) -> None:
        pass


ENVIRONMENTS["bench_slow_tool"] = SlowTool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds: each environment step takes U(0, this)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--lag",
        type=int,
        default=EnvConfig.model_fields["answer_lag_steps"].default,
        help="env.answer_lag_steps of the fixed order",
    )
    args = parser.parse_args()

    model_dir = build_tiny_model(
        Path(tempfile.mkdtemp(prefix="rlvr-bench-")) / "model",
        "qwen2",
        hidden_size=128,
        num_layers=4,
        intermediate_size=512,
        max_position_embeddings=MAX_MODEL_LEN,
    )
    model = ModelConfig(path=str(model_dir))
    data = DataConfig(train="-", template="plain")
    problems = [Problem(id=f"q{i}", question=f"count to {i}", answer="") for i in range(args.prompts)]
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    turns = 0
    engine_config = EngineConfig(max_model_len=MAX_MODEL_LEN, kv_cache_gb=1)
    with make_engine(read_model_folder(model.path), engine_config, dtype=model.dtype, seed=0) as engine:
        from transformers import AutoTokenizer

        renderer = Renderer(AutoTokenizer.from_pretrained(model_dir), data)
        for round_index in range(args.rounds):
            for mode in MODES:
                config = EnvConfig(
                    name="bench_slow_tool",
                    max_turns=args.turns,
                    lockstep=mode == "lockstep",
                    workers=64,
                    answer_lag_steps=args.lag,
                    options={"latency": args.latency},
                )
                runner = TrajectoryRunner(
                    engine,
                    renderer,
                    config,
                    EnvContext(config, SandboxConfig()),
                    max_model_len=MAX_MODEL_LEN,
                    fixed_order=mode == "fixed",
                )
                starts = [Start(p, renderer.prompt(p)) for p in problems]
                started = time.perf_counter()
                trajectories = runner.run(starts, args.samples, Sampling(max_tokens=args.max_tokens, seed=round_index))
                seconds[mode].append(time.perf_counter() - started)
                turns = sum(t.turns for t in trajectories)
                print(f"round {round_index} {mode}: {seconds[mode][-1]:.2f} s, {turns} turns", flush=True)
    median = {mode: statistics.median(values) for mode, values in seconds.items()}
    result = {
        "setting": vars(args) | {"out": str(args.out)},
        "seconds": seconds,
        "median_s": median,
        "speedup": median["lockstep"] / median["continuous"],
        "fixed_order_slowdown": median["fixed"] / median["continuous"],
        "turns_per_run": turns,
        **provenance(),
    }
    write_result(args.out, result)
    append_line(
        f"multi-turn rollouts, continuous vs lockstep scheduling ({args.prompts} prompts x {args.samples} samples, "
        f"{args.turns} turns of up to {args.max_tokens} tokens, environment steps U(0, {args.latency}) s, vLLM in-process, "
        f"tiny random Qwen2): continuous {median['continuous']:.2f} s vs lockstep {median['lockstep']:.2f} s per batch "
        f"(medians of {args.rounds}), **{result['speedup']:.2f}x**; async's fixed order (lag {args.lag} steps) {median['fixed']:.2f} s, "
        f"**{result['fixed_order_slowdown']:.2f}x** continuous's time",
        result,
    )


if __name__ == "__main__":
    main()
