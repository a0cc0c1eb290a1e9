"""Routing replay (R3): record which experts each MoE router chose, make a forward use given
choices, and measure how often the trainer's own router agrees.

An MoE policy routes each token to its top-k experts per layer. The sampler (vLLM, or the
transformers engine) and the trainer compute the router logits with different kernels, and
in low precision a near-tie flips which experts a token gets: the trainer then scores the
sampled token under a different sub-network than the one that produced it, a large and
growing sampler/trainer gap that is a known cause of MoE RL collapse. Rollout Routing Replay
(R3; Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and Inference
Routers") records the sampler's expert choices and replays them in the trainer's forward: the
*choice* comes from the sampler, the *gate weights* of the chosen experts from the trainer's
own router scores (so the router still gets its gradient). slime and verl do it by replacing
the router's top-k; so does rlvr:

transformers 5 routers (found by rlvr.models.moe) all pick experts with one `torch.topk` over
`[tokens, num_experts]` scores and derive everything else (weights, normalisation, scaling)
from the indices it returns. While a router runs, a `TorchFunctionMode` watches `torch.topk`;
for the call over `[tokens, num_experts]` with `k = top_k` it records the indices, and under
replay returns the recorded indices with the scores gathered at them (`scores.gather(-1, idx)`)
instead. Group-limited routing (DeepSeek-V3's `n_group` pre-selection) runs its own top-ks over
other shapes, which pass through untouched; the replayed choice overrides the group mask too.

Routes are `[tokens, moe_layers, k]` long tensors, vLLM's `routed_experts` layout
(`[seq_len, layer_num, topk]`); a negative entry means "no recorded choice: use the trainer's".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from rlvr.models.moe import MoELayer, moe_layers

_TOPK = (torch.topk, torch.Tensor.topk)


class _ExpertChoice(TorchFunctionMode):
    """Active while one router runs: records its expert top-k, and under replay substitutes it."""

    def __init__(self, layer: MoELayer, seen: list[torch.Tensor], replay: torch.Tensor | None, every_call: bool):
        super().__init__()
        self.layer, self.seen, self.replay, self.every_call = layer, seen, replay, every_call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _TOPK:
            return func(*args, **kwargs)
        scores, k = args[0], kwargs.get("k", args[1] if len(args) > 1 else None)
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
        is_choice = (
            scores.ndim == 2 and scores.shape[1] == self.layer.num_experts and k == self.layer.top_k and dim in (-1, 1)
        )
        own = func(*args, **kwargs)
        if not is_choice:
            return own
        if self.every_call or not self.seen:  # under replay, a recomputation repeats the first forward
            self.seen.append(own.indices.detach())
        if self.replay is None:
            return own
        if self.replay.shape != own.indices.shape:
            raise ValueError(
                f"{self.layer.router_name}: routes give {tuple(self.replay.shape)} choices, the forward routes "
                f"{tuple(own.indices.shape)} (tokens, top-k)"
            )
        replay = self.replay.to(own.indices.device)
        indices = torch.where(replay >= 0, replay, own.indices)
        return torch.return_types.topk((scores.gather(-1, indices), indices))


def _enter(mode: TorchFunctionMode) -> None:
    mode.__enter__()


def _exit(mode: TorchFunctionMode) -> None:
    mode.__exit__(None, None, None)


@dataclass
class RoutingRecord:
    """The expert choices routers made inside a `record_routing` / `replay_routing` block: for
    each MoE layer (in forward order), one `[tokens, k]` tensor per router call."""

    layers: list[str]
    calls: list[list[torch.Tensor]] = field(default_factory=list)

    def stacked(self) -> torch.Tensor:
        """`[tokens, moe_layers, k]`: every forward's tokens in call order (a forward of a batch
        `[B, T]` contributes its B·T tokens row-major, as the router sees them)."""
        counts = {len(c) for c in self.calls}
        if len(counts) != 1:
            raise ValueError(f"routers were called unequal numbers of times ({sorted(counts)}); cannot align layers")
        return torch.stack([torch.cat(c) for c in self.calls], dim=1)

    def per_sequence(self, batch_size: int) -> torch.Tensor:
        """`[batch_size, positions, moe_layers, k]` for forwards over `[batch_size, T_i]` inputs
        (a generate loop: the prompt forward, then one forward per new token)."""
        steps = zip(*self.calls, strict=True)
        return torch.cat(
            [torch.stack(step, dim=1).view(batch_size, -1, len(self.layers), step[0].shape[-1]) for step in steps],
            dim=1,
        )


Routed = nn.Module | list[MoELayer]  # a transformers model, or the MoE layers of another (a Megatron model's)


@contextmanager
def _watch_routers(model: Routed, routes: torch.Tensor | None, every_call: bool) -> Iterator[RoutingRecord]:
    layers = model if isinstance(model, list) else moe_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE layers to route")
    if routes is not None and (routes.ndim != 3 or routes.shape[1] != len(layers)):
        raise ValueError(f"routes must be [tokens, {len(layers)} MoE layers, k], got {tuple(routes.shape)}")
    record = RoutingRecord([layer.router_name for layer in layers], [[] for _ in layers])
    handles = []
    for i, layer in enumerate(layers):
        mode = _ExpertChoice(layer, record.calls[i], None if routes is None else routes[:, i], every_call)
        # hooks that return nothing, so that the router's inputs and outputs stay its own
        handles.append(layer.router.register_forward_pre_hook(lambda *_, mode=mode: _enter(mode)))
        handles.append(layer.router.register_forward_hook(lambda *_, mode=mode: _exit(mode), always_call=True))
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()


def record_routing(model: Routed):
    """Context manager: within it, every forward of `model` records its routers' top-k choices.

    with record_routing(model) as record:
        model.generate(ids, ...)
    routes = record.per_sequence(batch_size=ids.shape[0])  # [B, positions, layers, k]
    """
    return _watch_routers(model, None, every_call=True)


def replay_routing(model: Routed, routes: torch.Tensor | None):
    """Context manager: within it, every forward of `model` over `routes.shape[0]` tokens routes
    token t in MoE layer l to the experts `routes[t, l]` (where they are >= 0), with gate weights
    from its own router's scores. It yields the record of the router's *own* choices in the
    first forward, for `routing_agreement`. `routes=None` (nothing to replay, e.g. a rank's
    empty micro-batch) lets the model route itself and only records.

    Keep the block open through `backward()` when the model recomputes activations (gradient
    checkpointing): the recomputed forward must route as the first one did.

        with replay_routing(model, routes) as own:
            loss = loss_fn(model(ids))
            loss.backward()
        agreeing, compared = agreement_counts(own.stacked(), routes)
    """
    return _watch_routers(model, routes, every_call=False)


def row_routes(micro_batch, routes: Mapping[int, torch.Tensor]) -> torch.Tensor | None:
    """The routes of a packed trainer row (rlvr.training.packing.MicroBatch) `[L, layers, k]`
    from each sequence's routes `[positions, layers, k]` (keyed by sequence index, as the sampler
    returned them; positions past a sequence's routes are -1); None for an empty micro-batch.

    Rows are units of a prompt and its completions: a token whose position restarts at 0 opens
    a unit (its prompt belongs to the unit's first sequence), one whose position steps back
    otherwise starts the next completion of the same prompt; a token takes the routes of its
    sequence at its position.
    """
    if micro_batch.is_empty:
        return None
    positions = micro_batch.position_ids[0].tolist()
    members = iter(micro_batch.sequences)
    first = routes[micro_batch.sequences[0]]
    out = torch.full((len(positions), *first.shape[1:]), -1, dtype=torch.long)
    owner = None
    for t, position in enumerate(positions):
        if owner is None or position <= positions[t - 1]:
            owner = next(members)
        sequence_routes = routes[owner]
        if position < sequence_routes.shape[0]:
            out[t] = sequence_routes[position]
    return out


def compact_routes(routes: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Routes in the smallest integer type that holds every expert id, as vLLM returns them
    (uint8 up to 256 experts, DeepSeek-V3's count; int16 beyond): what a Rollout carries to the
    trainer ranks, 8x (int16: 4x) smaller than torch's int64 indices."""
    return routes.to(torch.uint8 if num_experts <= 256 else torch.int16)


def agreement_counts(own: torch.Tensor, recorded: torch.Tensor) -> tuple[int, int]:
    """(agreeing, compared): over the (token, MoE layer) pairs that have a recorded choice
    (`recorded >= 0`), how many the trainer's own top-k reproduces as a set. Both `[T, layers, k]`."""
    compared = (recorded >= 0).all(dim=-1)
    same = (own.sort(dim=-1).values == recorded.sort(dim=-1).values).all(dim=-1)
    return int((same & compared).sum()), int(compared.sum())


def routing_agreement(own: torch.Tensor, recorded: torch.Tensor) -> float:
    """`moe/routing_agreement`: the fraction of recorded (token, MoE layer) pairs whose top-k
    expert set the trainer's own router reproduces (1.0: sampler and trainer route alike)."""
    agreeing, compared = agreement_counts(own, recorded)
    return agreeing / compared if compared else float("nan")


def expert_counts(choices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """`[layers, num_experts]`: how many tokens each MoE layer sent to each expert, from
    `[T, layers, k]` choices; negative entries are not counted."""
    tokens, layers, k = choices.shape
    loads = torch.zeros(layers, num_experts + 1)
    index = torch.where(choices >= 0, choices.long(), num_experts).permute(1, 0, 2).reshape(layers, -1).cpu()
    loads.scatter_add_(1, index, torch.ones(index.shape))
    return loads[:, :num_experts]


def expert_load_max_over_mean(counts: torch.Tensor) -> torch.Tensor:
    """`moe/expert_load_max_over_mean` per MoE layer `[layers]` from `expert_counts`: the busiest
    expert's token count over the mean count `T·k / E` (1.0: perfectly balanced; E/k: every token
    to the same experts)."""
    return counts.max(dim=1).values / counts.mean(dim=1).clamp(min=1e-12)
