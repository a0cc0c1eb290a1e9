"""A Megatron rank's part of a run checkpoint: its part of the LoRA factors (split as the rank
holds them), its optimizer state, schedule and RNG, in one file per rank. A resumed run has the
same layout (trainer.megatron), so each rank reads back its own file; the frozen base is read
from the model folder again."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch


def _path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"megatron_rank{rank}.pt")


def save_rank(folder: str, rank: int, trainable: Sequence[tuple[str, torch.Tensor]], optimizer, scheduler) -> None:
    torch.save(
        {
            "trainable": {name: p.detach().cpu() for name, p in trainable},
            "optim": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": torch.get_rng_state(),
        },
        _path(folder, rank),
    )


def load_rank(
    folder: str, rank: int, trainable: Sequence[tuple[str, torch.Tensor]], optimizer, scheduler, with_optimizer: bool
) -> None:
    """Put back what `save_rank` wrote; without `with_optimizer`, the weights alone and a fresh optimizer."""
    path = _path(folder, rank)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no Megatron rank checkpoint (saved with another trainer.backend or layout?)")
    state = torch.load(path, weights_only=False)
    saved = state["trainable"]
    with torch.no_grad():
        for name, p in trainable:
            p.copy_(saved[name])
    if not with_optimizer:
        optimizer.state.clear()
        return
    optimizer.load_state_dict(state["optim"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
