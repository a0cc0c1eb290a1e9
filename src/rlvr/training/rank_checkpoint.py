"""A trainer rank's part of a run checkpoint: its shard of the trainable weights and optimizer
state through torch.distributed.checkpoint (DCP), plus its schedule and RNG in a file of its own.
The frozen base is never saved: a resumed run loads it from the model folder again."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

# The frozen base is left out of checkpoints; `strict` (read only when setting) would reject
# every load for lacking it, and dcp.load already fails on any saved tensor missing.
STATE_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)


def save_rank(folder: str, rank: int, policy, optimizer, scheduler, device: torch.device, alone: bool) -> None:
    """Sharded trainable weights + optimizer, plus the schedule and this rank's RNG; every rank
    writes its own shard into `folder`. `alone`: one rank, saved without collectives."""
    model, optim = get_state_dict(policy, optimizer, options=STATE_OPTIONS)
    dcp.save({"model": model, "optim": optim}, checkpoint_id=os.path.join(folder, "dcp"), no_dist=alone)
    torch.save(
        {
            "scheduler": scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        },
        os.path.join(folder, f"rank{rank}.pt"),
    )


def load_rank(folder: str, rank: int, policy, optimizer, scheduler, device: torch.device, alone: bool) -> None:
    """Put back what `save_rank` wrote: weights, optimizer, schedule and RNG."""
    model, optim = get_state_dict(policy, optimizer, options=STATE_OPTIONS)
    state: dict[str, Any] = {"model": model, "optim": optim}  # dcp.load fills it in place
    dcp.load(state, checkpoint_id=os.path.join(folder, "dcp"), no_dist=alone)
    set_state_dict(
        policy, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=STATE_OPTIONS
    )
    extra = torch.load(os.path.join(folder, f"rank{rank}.pt"), weights_only=False)
    scheduler.load_state_dict(extra["scheduler"])
    torch.set_rng_state(extra["rng"])
    if extra.get("cuda_rng") is not None and device.type == "cuda":  # LoRA dropout draws on the device
        torch.cuda.set_rng_state(extra["cuda_rng"], device)


def load_rank_weights(folder: str, policy, optimizer, alone: bool) -> None:
    """The trainable weights `save_rank` wrote, with the optimizer started afresh (no moments,
    step 0), as a new run from those weights would start."""
    weights = {"model": get_model_state_dict(policy, options=STATE_OPTIONS)}
    dcp.load(weights, checkpoint_id=os.path.join(folder, "dcp"), no_dist=alone)
    set_model_state_dict(policy, weights["model"], options=STATE_OPTIONS)
    optimizer.state.clear()
