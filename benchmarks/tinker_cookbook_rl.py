"""tinker-cookbook's RL recipe, unmodified, against `rlvr serve`: does the reward rise?

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/tinker_cookbook_rl.py --out runs/bench/tinker_cookbook_rl.json

`make smollm2`'s NVFP4 SmolLM2-135M-Instruct is the base (LoRA on the frozen 4-bit weights, vLLM
sampling); the recipe is `tinker_cookbook.recipes.math_rl.train env=arithmetic` (sums of two
numbers 0-100, with the recipe's one-shot example "What is 4 + 5?" -> "9"), run as its README
says, with `qwen3_instruct` as the renderer: ChatML, SmolLM2's own chat format, which stops on
the `<|im_end|>` token id. The recipe draws its problems unseeded, so two runs see different
sums; the figures are each step's mean reward over groups_per_batch x group_size samples.

Written: each step's reward and accuracy as the recipe logged them, the first and last quarter's
means, the wall time, and the server's request-log lines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _ledger import append_line, provenance, write_result

ROOT = Path(__file__).resolve().parents[1]


def serve(folder: Path, port: int, rank_alpha: float) -> subprocess.Popen:
    config = folder / "serve.yaml"
    config.write_text(f"checkpoint_dir: {folder / 'checkpoints'}\nlog_every_s: 60\n"
                      "engine:\n  max_model_len: 256\n  kv_cache_gb: 1\n  num_threads: 2\n"
                      f"trainer:\n  lora:\n    alpha: {rank_alpha}\n")
    process = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "serve", "--port", str(port), "--config", str(config)],
                               stdout=open(folder / "server.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=2).close()
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"rlvr serve did not start:\n{(folder / 'server.log').read_text()[-2000:]}")
            time.sleep(1)


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
    args = parser.parse_args()
    if not Path(args.model, "config.json").is_file():
        raise SystemExit(f"{args.model}: no model folder; run `make smollm2` first")

    folder = Path(tempfile.mkdtemp(prefix="tinker_cookbook_rl_"))
    server = serve(folder, args.port, args.alpha)
    command = [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train", f"base_url=http://127.0.0.1:{args.port}",
               f"model_name={args.model}", f"renderer_name={args.renderer}", "env=arithmetic",
               "loss_fn=importance_sampling", f"groups_per_batch={args.groups}", f"group_size={args.group_size}",
               f"max_steps={args.steps}", f"learning_rate={args.lr}", f"lora_rank={args.rank}",
               f"max_tokens={args.max_tokens}", "eval_every=0", "save_every=0", f"log_path={folder / 'run'}",
               "behavior_if_log_dir_exists=delete"]
    start = time.monotonic()
    try:
        done = subprocess.run(command, env={**os.environ, "TINKER_API_KEY": "tml-dummy"}, cwd=folder,
                              capture_output=True, text=True)
    finally:
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
        "model": args.model, "renderer": args.renderer, "steps": len(steps), "groups_per_batch": args.groups,
        "group_size": args.group_size, "learning_rate": args.lr, "lora_rank": args.rank, "max_tokens": args.max_tokens,
        "reward": reward, "correct": correct,
        "reward_first_quarter": round(sum(reward[:quarter]) / quarter, 4),
        "reward_last_quarter": round(sum(reward[-quarter:]) / quarter, 4),
        "correct_first_quarter": round(sum(correct[:quarter]) / quarter, 4),
        "correct_last_quarter": round(sum(correct[-quarter:]) / quarter, 4),
        "wall_s": round(wall, 1), "s_per_step": round(wall / max(1, len(steps)), 1),
        "server_log": [line for line in (folder / "server.log").read_text().splitlines() if line.startswith("rlvr serve:")],
    }
    write_result(args.out, result)
    append_line(
        f"tinker-cookbook math_rl env=arithmetic, unmodified, against `rlvr serve` ({Path(args.model).name} "
        f"{Path(args.model).parent.name}, LoRA r{args.rank}, renderer {args.renderer}, {args.groups}x{args.group_size} "
        f"samples a step, lr {args.lr:g}): reward **{result['reward_first_quarter']:.3f} -> {result['reward_last_quarter']:.3f}** "
        f"(first vs last quarter of {len(steps)} steps), accuracy {result['correct_first_quarter']:.3f} -> "
        f"{result['correct_last_quarter']:.3f}; {wall:.0f} s ({result['s_per_step']} s a step)", result)


if __name__ == "__main__":
    main()
