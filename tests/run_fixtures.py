"""A small real run for the controller tests (imported, not a conftest): the demo's stack (vLLM,
2 FSDP2 ranks, LoRA on an NVFP4 base) on a tiny task, configured in one place."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from rich.console import Console

from rlvr.config import load_config
from rlvr.demo import ensure_demo_assets

# A reward that varies between samples even for an untrained model, so every step's adapter moves.
DIGIT_SHARE = '''
def digit_share(response, answer):
    return sum(c.isdigit() for c in response) / max(1, len(response))
'''


def small_config(root: Path, name: str, steps: int, reward: str | None = None, **sections) -> Path:
    """Write ROOT/NAME.yaml: the demo config, shrunk, with its run in ROOT/NAME and the assets
    (built on first use) in ROOT/assets; `sections` update the config's sections key by key."""
    cfg = yaml.safe_load(open("configs/demo.yaml"))
    assets = root / "assets"
    cfg.update(run_dir=str(root / name), steps=steps)
    cfg["model"]["path"] = str(assets / "model")
    cfg["data"].update(train=str(assets / "task/train.jsonl"), test=str(assets / "task/test.jsonl"))
    cfg["rollout"].update(prompts_per_step=4, samples_per_prompt=4)
    cfg["eval"].update(n=2, k=[1, 2], max_problems=2)
    cfg["demo"]["warm_start"].update(steps=0)
    cfg["demo"]["task"].update(train_size=32, test_size=4)
    cfg["tracking"] = {"progress": False}
    if reward is not None:
        (root / "reward.py").write_text(reward)
        cfg["reward"]["verifier"] = f"{root / 'reward.py'}:{reward.split('def ')[1].split('(')[0]}"
    for section, values in sections.items():
        cfg[section] = cfg.get(section, {}) | values
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ensure_demo_assets(load_config(path), Console(quiet=True))
    return path


def start_training(config: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", str(config), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def step_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's per-step lines (those of an RL step, not the eval-only ones)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [row for row in rows if "reward/mean" in row]
