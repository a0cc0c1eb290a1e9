"""One trainer step, attention × micro-batch token budget, side by side in one run.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/train_step.py --out runs/bench_train_step.json

Two batch shapes (`--shape`), 16 prompts × 8 samples of random ids: `demo`, prompts of 45-59
tokens and completions of 20-31 tokens (~10k tokens in all); `longtail`, the counting
workload's (benchmarks/vs_trl.py --workload longtail): prompts of 55-60 tokens, each prompt's
completions around its own length, ~12 tokens a counting step, 1-32 steps drawn log-uniformly
(~20-400 tokens, median ~80). Through `Trainer.train_step` on the demo's float model with LoRA
r16 on all linear layers, one rank (the cores' threads). Settings: `sdpa` (transformers'
block-diagonal mask), `packed` (rlvr's packed attention, a prompt copy per sample), `shared`
(packed attention, one prompt copy per group: trainer.share_prompts), and `shared1` (shared,
but each micro-batch attended in one padded batch, as before sequences were split by length
into several: rlvr.training.attention.CALL_OVERHEAD_PAIRS). For each setting the median of 3
steps after one warm-up, and the loss, which must not depend on the setting: packing and
attention change the cost, never the numbers.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import torch
from _ledger import append_line, provenance, write_result

import rlvr.training.attention as attention_module
from rlvr.config import AlgorithmConfig, LoraConfig, ModelConfig, TrainerConfig
from rlvr.models.folder import read_model_folder
from rlvr.records import TrainBatch
from rlvr.training.trainer import Trainer
from rlvr.training.worker import RankSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OVERHEAD = attention_module.CALL_OVERHEAD_PAIRS


def demo_shaped_batch(prompts: int = 16, samples: int = 8, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    distinct = [
        torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(45, 60, (prompts,), generator=g)
    ]
    size = prompts * samples
    completions = [
        torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(20, 32, (size,), generator=g)
    ]
    return TrainBatch(
        [distinct[i // samples] for i in range(size)],
        completions,
        [[-1.0] * len(c) for c in completions],
        torch.randn(size, generator=g),
        torch.arange(size) // samples,
    )


def longtail_batch(prompts: int = 16, samples: int = 8, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    distinct = [
        torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(55, 61, (prompts,), generator=g)
    ]
    steps = (33 ** torch.rand(prompts, generator=g)).long().clamp(1, 32)  # log-uniform 1..32, as counting_problems
    size = prompts * samples
    lengths = [
        max(8, int(12 * int(steps[i // samples]) * (0.9 + 0.2 * torch.rand(1, generator=g).item()) + 16))
        for i in range(size)
    ]
    completions = [torch.randint(3, 60, (n,), generator=g).tolist() for n in lengths]
    return TrainBatch(
        [distinct[i // samples] for i in range(size)],
        completions,
        [[-1.0] * len(c) for c in completions],
        torch.randn(size, generator=g),
        torch.arange(size) // samples,
    )


SHAPES = {"demo": demo_shaped_batch, "longtail": longtail_batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--model", default=str(ROOT / "artifacts" / "demo" / "model.float"), help="built by `rlvr demo`"
    )
    parser.add_argument("--budgets", default="512,2048,4096", help="micro_batch_tokens, comma separated")
    parser.add_argument(
        "--attention",
        default="sdpa,packed,shared",
        help="sdpa, packed, shared (packed + share_prompts), shared1 (shared in one padded batch per micro-batch)",
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    args = parser.parse_args()

    batch = SHAPES[args.shape]()
    model = ModelConfig(path=args.model)
    folder = read_model_folder(model.path)
    lora = LoraConfig(rank=16, alpha=32, dropout=0.0, target_modules="all-linear")
    settings = {}
    for attention in args.attention.split(","):
        for budget in (int(b) for b in args.budgets.split(",")):
            trainer_cfg = TrainerConfig(
                lr=1e-3,
                lora=lora,
                attention="sdpa" if attention == "sdpa" else "packed",
                micro_batch_tokens=budget,
                share_prompts=attention.startswith("shared"),
            )
            # the layouts are built here, in the controller (rlvr.training.packing): an overhead no
            # split can beat keeps each micro-batch one padded batch
            attention_module.CALL_OVERHEAD_PAIRS = float("inf") if attention == "shared1" else DEFAULT_OVERHEAD
            spec = RankSpec(
                folder=folder,
                dtype=model.dtype,
                trainer=trainer_cfg,
                algorithm=AlgorithmConfig(),
                seed=0,
                total_steps=100,
            )
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
    best = {
        a: min((k for k in settings if k.startswith(a + "/")), key=lambda k: settings[k]["step_s"])
        for a in args.attention.split(",")
    }
    result = {
        "settings": settings,
        "best": best,
        "tokens": sum(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)),
        **provenance(),
    }
    write_result(args.out, result)
    figures = ", ".join(f"{k} {v['step_s']:.3f} s" for k, v in settings.items())
    ratios = "; ".join(
        f"best {b} vs best {a} **{settings[best[a]]['step_s'] / settings[best[b]]['step_s']:.2f}x**"
        for a, b in itertools.pairwise(best)
    )
    append_line(
        f"trainer step, attention/micro_batch_tokens, 16 prompts × 8 {args.shape}-shaped samples ({result['tokens']} "
        f"tokens with a prompt copy per sample), 1 rank, LoRA r16, median of 3: {figures}; {ratios}; equal losses",
        result,
    )


if __name__ == "__main__":
    main()
