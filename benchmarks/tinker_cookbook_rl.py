"""tinker-cookbook's RL recipe, unmodified, against `rlvr serve`: does the reward rise?

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/tinker_cookbook_rl.py --out runs/bench/tinker_cookbook_rl.json

`make smollm2`'s NVFP4 SmolLM2-135M-Instruct is the base (LoRA on the frozen 4-bit weights, vLLM
sampling); the recipe is `tinker_cookbook.recipes.math_rl.train env=arithmetic` (sums of two
numbers 0-100, with the recipe's one-shot example "What is 4 + 5?" -> "9"), run as its README
says, with `qwen3_instruct` as the renderer: ChatML, SmolLM2's own chat format, which stops on
the `<|im_end|>` token id. The recipe draws its problems unseeded, so two runs see different
sums; the figures are each step's mean reward over groups_per_batch x group_size samples.

Written: each step's reward and accuracy as the recipe logged them, the first and last quarter's
means, the wall time, and the server's request-log lines. And memory: each trainer rank's peak
private memory (RssAnon, the rank process sampled every 5 ms from outside) and the server
process's (the controller with its in-process vLLM engine), against the plan's estimate of
the served run (`rlvr serve`'s memory check: rlvr.serve.model.planned_bytes, per rank the plan's
trainer column). `--set KEY=VALUE` sets a key of the served config (the serve YAML), e.g.
`--set trainer.gradient_checkpointing=true`.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/tinker_cookbook_rl.py --out runs/bench/tinker_cookbook_rl_qwen.json \
        --model artifacts/qwen2.5-coder-0.5b/nvfp4 --max-tokens 8 --set trainer.gradient_checkpointing=true
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from _ledger import append_line, provenance, write_result
from _proc import status_bytes, trainer_ranks
from _serve import start_server

from rlvr.config import set_dotted

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.005


def serve_config(folder: Path, model: str, rank_alpha: float, settings: list[str]) -> Path:
    """The served config: `model` in the catalog under its own path (the recipe loads its tokenizer
    by that name, and there is no hub here), the engine's sizes for this machine, LoRA's alpha, and
    each KEY=VALUE of `settings`."""
    config = {
        "checkpoint_dir": str(folder / "checkpoints"),
        "log_file": str(folder / "libraries.log"),
        "models": {model: model},
        "log_every_s": 60,
        "engine": {"max_model_len": 256, "kv_cache_gb": 1, "num_threads": 2},
        "trainer": {"lora": {"alpha": rank_alpha}},
    }
    for setting in settings:
        key, value = setting.split("=", 1)
        set_dotted(config, key, yaml.safe_load(value), source=f"--set {setting}")
    path = folder / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class PrivateMemory:
    """Peak private memory (RssAnon) of a server process and of each trainer rank it spawned (its
    children but multiprocessing's resource tracker), sampled every SAMPLE_S from this process."""

    def __init__(self, server_pid: int):
        self.server_pid = server_pid
        self.peaks: dict[int, int] = {}  # pid -> bytes
        self._ranks: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def rank_peaks(self) -> list[int]:
        return [self.peaks.get(pid, 0) for pid in self._ranks]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        listed = 0.0
        while not self._stop.is_set():
            if time.monotonic() - listed > 1.0:  # ranks start (and restart) with the models the client creates
                listed = time.monotonic()
                self._ranks += [pid for pid in trainer_ranks(self.server_pid) if pid not in self._ranks]
            for pid in (self.server_pid, *self._ranks):
                self.peaks[pid] = max(self.peaks.get(pid, 0), status_bytes(pid).get("RssAnon", 0))
            time.sleep(SAMPLE_S)


def planned(config: Path, model: str, rank: int) -> tuple[float, float, str]:
    """The plan's estimate for the served model: (one trainer rank, all its processes together, the compute dtype)."""
    from rlvr.config import ServeConfig, load_config
    from rlvr.hardware import compute_dtype, local_device
    from rlvr.planning.plan import all_devices_bytes, make_plan
    from rlvr.serve.model import served_run

    run = served_run(model, rank, load_config(config, schema=ServeConfig), log=lambda *_: None)
    plan = make_plan(run)
    rank_total = max(d.total for d in plan.devices if d.trainer_rank is not None)
    return rank_total, all_devices_bytes(plan)[0], compute_dtype(run.model.dtype, local_device()).name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=str(ROOT / "artifacts/smollm2/nvfp4"))
    parser.add_argument("--renderer", default="qwen3_instruct")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups", type=int, default=8, help="groups_per_batch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--max-tokens", type=int, default=5, help="the recipe's default: an answer and its stop token")
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a key of the served config, e.g. trainer.gradient_checkpointing=true (repeatable)",
    )
    args = parser.parse_args()
    if not Path(args.model, "config.json").is_file():
        raise SystemExit(f"{args.model}: no model folder; run `make smollm2` first")

    folder = Path(tempfile.mkdtemp(prefix="tinker_cookbook_rl_"))
    config = serve_config(folder, args.model, args.alpha, args.settings)
    plan_rank, plan_all, dtype = planned(config, args.model, args.rank)
    server = start_server(folder, args.port, config)
    memory = PrivateMemory(server.pid)
    command = [
        sys.executable,
        "-m",
        "tinker_cookbook.recipes.math_rl.train",
        f"base_url=http://127.0.0.1:{args.port}",
        f"model_name={args.model}",
        f"renderer_name={args.renderer}",
        "env=arithmetic",
        "loss_fn=importance_sampling",
        f"groups_per_batch={args.groups}",
        f"group_size={args.group_size}",
        f"max_steps={args.steps}",
        f"learning_rate={args.lr}",
        f"lora_rank={args.rank}",
        f"max_tokens={args.max_tokens}",
        "eval_every=0",
        "save_every=0",
        f"log_path={folder / 'run'}",
        "behavior_if_log_dir_exists=delete",
    ]
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, env={**os.environ, "TINKER_API_KEY": "tml-dummy"}, cwd=folder, capture_output=True, text=True
        )
    finally:
        memory.stop()
        server.terminate()
        server.wait(timeout=120)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"the recipe failed (rc {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    steps = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "env/all/reward/total" in s]
    reward = [round(s["env/all/reward/total"], 4) for s in steps]
    correct = [round(s["env/all/correct"], 4) for s in steps]
    quarter = max(1, len(steps) // 4)
    result = {
        **provenance(),
        "model": args.model,
        "renderer": args.renderer,
        "steps": len(steps),
        "groups_per_batch": args.groups,
        "group_size": args.group_size,
        "learning_rate": args.lr,
        "lora_rank": args.rank,
        "max_tokens": args.max_tokens,
        "reward": reward,
        "correct": correct,
        "reward_first_quarter": round(sum(reward[:quarter]) / quarter, 4),
        "reward_last_quarter": round(sum(reward[-quarter:]) / quarter, 4),
        "correct_first_quarter": round(sum(correct[:quarter]) / quarter, 4),
        "correct_last_quarter": round(sum(correct[-quarter:]) / quarter, 4),
        "wall_s": round(wall, 1),
        "s_per_step": round(wall / max(1, len(steps)), 1),
        "served_config": yaml.safe_load(config.read_text()),
        "compute_dtype": dtype,
        "rank_peak_private_gb": [round(b / 1e9, 3) for b in memory.rank_peaks()],
        "server_peak_private_gb": round(memory.peaks.get(server.pid, 0) / 1e9, 3),
        "plan_rank_gb": round(plan_rank / 1e9, 3),
        "plan_all_gb": round(plan_all / 1e9, 3),
        "server_log": [
            line for line in (folder / "server.log").read_text().splitlines() if line.startswith("rlvr serve:")
        ],
    }
    rank_peak = max(result["rank_peak_private_gb"], default=0.0)
    result["plan_rank_over_measured"] = round(result["plan_rank_gb"] / rank_peak, 3) if rank_peak else None
    write_result(args.out, result)
    append_line(
        f"tinker-cookbook math_rl env=arithmetic, unmodified, against `rlvr serve` ({Path(args.model).name} "
        f"{Path(args.model).parent.name}, {dtype}, LoRA r{args.rank}, renderer {args.renderer}, {args.groups}x{args.group_size} "
        f"samples a step, lr {args.lr:g}): reward **{result['reward_first_quarter']:.3f} -> {result['reward_last_quarter']:.3f}** "
        f"(first vs last quarter of {len(steps)} steps), accuracy {result['correct_first_quarter']:.3f} -> "
        f"{result['correct_last_quarter']:.3f}; {wall:.0f} s ({result['s_per_step']} s a step); peak private memory: "
        f"trainer rank{'s' * (len(result['rank_peak_private_gb']) > 1)} **{', '.join(f'{g:.2f}' for g in result['rank_peak_private_gb'])} GB** "
        f"against the plan's {result['plan_rank_gb']:.2f} GB (plan / measured {result['plan_rank_over_measured']}), "
        f"server process (controller and engine) {result['server_peak_private_gb']:.2f} GB; the plan's total "
        f"{result['plan_all_gb']:.2f} GB",
        result,
    )


if __name__ == "__main__":
    main()
