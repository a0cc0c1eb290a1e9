"""Supervised warm start: a few steps of next-token loss on (prompt, target) pairs.

RL needs a policy whose rewards are neither all zero nor all one (a group with one reward
value has zero advantage everywhere). A short supervised phase on worked answers gets a
random model there. Single process, in place: it runs once, before the RL run starts.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F

from rlvr.models.transformers_classes import causal_lm_from_pretrained


def warm_start(
    model_dir: str | Path,
    pairs: list[tuple[list[int], list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    pad_id: int,
    out_dir: str | Path | None = None,
    progress=None,
    check=None,
    check_every: int = 0,
) -> list[float]:
    """Train on (prompt ids, target ids, target loss mask) triples, loss on the targets' masked-in
    tokens only (an environment's observations inside a target are masked out); save to out_dir.

    `check(model, step) -> bool`, called every `check_every` steps and after the last, ends the
    training early when it returns True (the demo's readiness check, rlvr.demo.warm_start)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = causal_lm_from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))  # warmup, then flat
    losses = []
    for step in range(1, steps + 1):
        batch = rng.sample(pairs, min(batch_size, len(pairs)))
        input_ids, labels = _collate(batch, pad_id)
        logits = model(input_ids=input_ids, attention_mask=(input_ids != pad_id).long()).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if progress is not None:
            progress(loss.item())
        if check is not None and (step % check_every == 0 or step == steps) and check(model, step):
            break
    model.save_pretrained(out_dir or model_dir)
    return losses


def _collate(batch: list[tuple[list[int], list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) + len(t) for p, t, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, (prompt, target, mask) in enumerate(batch):
        seq = prompt + target
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, len(prompt) : len(seq)] = torch.tensor([t if m else -100 for t, m in zip(target, mask)])
    return ids, labels
