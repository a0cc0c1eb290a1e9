"""One trainer step, attention × micro-batch token budget, side by side in one run.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/train_step.py --out runs/bench_train_step.json

The demo's shape: 16 prompts of 45-59 tokens × 8 samples, completions of 20-31 tokens (~10k
tokens in all, random ids), through `Trainer.train_step` on the demo's float model with LoRA
r16 on all linear layers, one rank (the cores' threads). Settings: `sdpa` (transformers'
block-diagonal mask), `packed` (rlvr's packed attention, a prompt copy per sample) and `shared`
(packed attention, one prompt copy per group: trainer.share_prompts). For each setting the
median of 3 steps after one warm-up, and the loss, which must not depend on the setting:
packing and attention change the cost, never the numbers.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import torch
from _ledger import append_line, provenance, write_result

from rlvr.records import TrainBatch
from rlvr.training.trainer import Trainer
from rlvr.config import AlgorithmConfig, LoraConfig, ModelConfig, TrainerConfig
from rlvr.training.worker import RankSpec

ROOT = Path(__file__).resolve().parents[1]


def demo_shaped_batch(prompts: int = 16, samples: int = 8, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    distinct = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(45, 60, (prompts,), generator=g)]
    size = prompts * samples
    completions = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(20, 32, (size,), generator=g)]
    return TrainBatch([distinct[i // samples] for i in range(size)], completions, [[-1.0] * len(c) for c in completions],
                      torch.randn(size, generator=g), torch.arange(size) // samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=str(ROOT / "artifacts" / "demo" / "model.float"), help="built by `rlvr demo`")
    parser.add_argument("--budgets", default="512,2048,4096", help="micro_batch_tokens, comma separated")
    parser.add_argument("--attention", default="sdpa,packed,shared", help="sdpa, packed, shared (packed + share_prompts)")
    args = parser.parse_args()

    batch = demo_shaped_batch()
    lora = LoraConfig(rank=16, alpha=32, dropout=0.0, target_modules="all-linear")
    settings = {}
    for attention in args.attention.split(","):
        for budget in (int(b) for b in args.budgets.split(",")):
            trainer_cfg = TrainerConfig(lr=1e-3, lora=lora, attention="sdpa" if attention == "sdpa" else "packed",
                                        micro_batch_tokens=budget, share_prompts=attention == "shared")
            spec = RankSpec(model=ModelConfig(path=args.model), trainer=trainer_cfg, algorithm=AlgorithmConfig(), seed=0,
                            total_steps=100)
            with Trainer(spec) as trainer:
                trainer.train_step(batch)
                seconds, loss = [], None
                for _ in range(3):
                    started = time.perf_counter()
                    loss = trainer.train_step(batch)["loss"]
                    seconds.append(time.perf_counter() - started)
            settings[f"{attention}/{budget}"] = {"step_s": statistics.median(seconds), "loss": loss}
    losses = [s["loss"] for s in settings.values()]
    if max(losses) - min(losses) > 1e-5:
        raise SystemExit(f"the settings disagree on the loss: {settings}")
    best = {a: min((k for k in settings if k.startswith(a + "/")), key=lambda k: settings[k]["step_s"])
            for a in args.attention.split(",")}
    result = {"settings": settings, "best": best, "tokens": sum(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)),
              **provenance()}
    write_result(args.out, result)
    figures = ", ".join(f"{k} {v['step_s']:.3f} s" for k, v in settings.items())
    ratios = "; ".join(f"best {b} vs best {a} **{settings[best[a]]['step_s'] / settings[best[b]]['step_s']:.2f}x**"
                       for a, b in itertools.pairwise(best))
    append_line(f"trainer step, attention/micro_batch_tokens, 16 prompts × 8 demo-shaped samples ({result['tokens']} "
                f"tokens with a prompt copy per sample), 1 rank, LoRA r16, median of 3: {figures}; {ratios}; equal losses",
                result)


if __name__ == "__main__":
    main()
