"""Where a run's processes go, as the `placement` section asks: the node and GPUs of every engine
and trainer rank, and what each reserves. One layout, checked once, for every reader: the device
table of `rlvr train CFG --dry-run` (rlvr.planning.plan), the Ray backend's placement group
(rlvr.orchestration.ray_placement) and `rlvr rehearse`.

    layout = plan_layout(cfg.placement, ranks=cfg.trainer.ranks, engines=cfg.engine.replicas,
                         tp=cfg.engine.tensor_parallel_size)     # PlanError (one line) when it cannot
    layout.engines, layout.trainers                              # Slots: role, index, node, gpus, bundle

With GPUs (placement.gpus_per_node):
- engines: `engine.replicas` of them, each a tensor-parallel group of TP GPUs within one node,
  packed node by node from node 0 (gpus_per_node // TP engines a node).
- colocate: the trainer's FSDP2 ranks take GPUs 0..ranks-1, packed node by node, under the
  engines' GPUs.
- split: the engines get `engine_gpus` = replicas x TP GPUs of their own, the trainer ranks the
  GPUs left, in node and GPU order.
Without GPUs every process is on node 0: one machine, whose cores rlvr.planning.cpu_split divides.

Each slot belongs to a bundle, what Ray reserves as one: a bundle per trainer rank (one CPU,
and one GPU with GPUs); colocated, engine i shares trainer rank i's, half of it each (the engine
sleeps while the trainer runs); split, each engine has one of its own holding its TP group (so
one node), numbered first, so that Ray's PACK, which fills a node before the next, puts the
engines on the first nodes as above. Sharing one GPU, a colocated engine on Ray is TP 1, and
there are no more of them than trainer ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlvr.config import PlacementConfig

Place = tuple[int, tuple[int, ...]]  # a node and GPU indices on it


class PlanError(ValueError):
    """The placement cannot hold the run; the message is one line naming the keys."""


@dataclass(frozen=True)
class Slot:
    """One engine (its whole TP group) or one trainer rank, where it runs, and its share of its
    bundle: half for a colocated engine and the trainer rank it shares with."""

    role: Literal["engine", "trainer"]
    index: int  # the engine's replica, the trainer's rank
    node: int
    gpus: tuple[int, ...]  # device indices on the node; none without GPUs
    bundle: int
    share: float = 1.0

    @property
    def cpus(self) -> float:
        return self.share  # a bundle holds one CPU

    @property
    def reserved_gpus(self) -> float:
        return self.share * len(self.gpus)


@dataclass(frozen=True)
class Layout:
    nodes: int
    gpus_per_node: int
    slots: tuple[Slot, ...]  # the engines by replica, then the trainer ranks by rank

    @property
    def engines(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.role == "engine"]

    @property
    def trainers(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.role == "trainer"]

    @property
    def cpus(self) -> float:
        return sum(slot.cpus for slot in self.slots)


def plan_layout(placement: PlacementConfig, *, ranks: int, engines: int, tp: int) -> Layout:
    """`engines` TP-`tp` engines and `ranks` trainer ranks placed as the module doc-string says,
    or PlanError naming the key that cannot hold them."""
    p, per_node = placement, placement.gpus_per_node
    if per_node and tp > per_node:
        raise PlanError(
            f"engine.tensor_parallel_size={tp} > placement.gpus_per_node={per_node}: a TP group stays on one node"
        )
    if per_node and not p.colocate and p.engine_gpus != engines * tp:
        raise PlanError(
            f"placement.engine_gpus={p.engine_gpus} must equal engine.replicas x engine.tensor_parallel_size = "
            f"{engines} x {tp} (split placement: each engine's GPUs are its TP group)"
        )
    if p.backend == "ray" and p.colocate and engines > ranks:
        raise PlanError(
            f"engine.replicas={engines}: colocated, each engine shares a trainer rank's bundle, and trainer.ranks={ranks}"
        )
    if p.backend == "ray" and p.colocate and per_node and tp > 1:
        raise PlanError(
            f"engine.tensor_parallel_size={tp}: the engine's slot has 1 GPU(s) (colocated, it shares a trainer "
            f"rank's GPU: use placement.colocate: false with placement.engine_gpus={tp * engines})"
        )
    if per_node:
        engine_places, rank_places = _gpus(p, ranks, engines, tp)
    else:  # one machine
        engine_places, rank_places = [(0, ())] * engines, [(0, ())] * ranks
    # colocated, bundle i holds trainer rank i and engine i, half each; split, the engines' come first
    shared, first_rank_bundle = (min(engines, ranks), 0) if p.colocate else (0, engines)
    slots = [
        Slot("engine", replica, node, gpus, replica, 0.5 if replica < shared else 1.0)
        for replica, (node, gpus) in enumerate(engine_places)
    ] + [
        Slot("trainer", rank, node, gpus, first_rank_bundle + rank, 0.5 if rank < shared else 1.0)
        for rank, (node, gpus) in enumerate(rank_places)
    ]
    return Layout(p.nodes, per_node, tuple(slots))


def _gpus(p: PlacementConfig, ranks: int, engines: int, tp: int) -> tuple[list[Place], list[Place]]:
    """Each engine's and each rank's (node, GPU indices): engines packed node by node, ranks
    colocated on the first GPUs, split on the GPUs the engines leave; PlanError where the nodes
    have too few."""
    per_node = p.gpus_per_node
    engines_per_node = per_node // tp
    engine_gpus = [
        (r // engines_per_node, tuple((r % engines_per_node) * tp + t for t in range(tp))) for r in range(engines)
    ]
    taken = {(node, gpu) for node, gpus in engine_gpus for gpu in gpus}
    grid = [(node, gpu) for node in range(p.nodes + ranks + engines) for gpu in range(per_node)]  # more than enough
    if p.colocate:
        rank_places = grid[:ranks]
        what = f"{ranks} trainer ranks sharing with " + (
            f"a TP-{tp} engine" if engines == 1 else f"{engines} TP-{tp} engines"
        )
    else:
        rank_places = [place for place in grid if place not in taken][:ranks]
        what = f"{ranks} trainer ranks + {engines * tp} engine GPUs"
    last = max(taken | set(rank_places))
    if last[0] >= p.nodes:
        needed = last[0] * per_node + last[1] + 1  # GPUs up to the last one used, idle ones between included
        within = ", each engine within one node" if per_node % tp else ""
        raise PlanError(
            f"placement: {what} need {needed} GPUs{within}; nodes={p.nodes} x gpus_per_node={per_node} "
            f"has {p.nodes * per_node}"
        )
    return engine_gpus, [(node, (gpu,)) for node, gpu in rank_places]
