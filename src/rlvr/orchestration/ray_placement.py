"""Placement `ray`: the trainer ranks and the engine as Ray actors in one placement group.

    cluster = RayCluster.shared(cfg.placement, ranks=2, engines=cfg.engine.replicas, tp=4)
    trainer = Trainer(spec, launch=cluster.launch_ranks)
    engine = make_engine(folder, cfg.engine, dtype=cfg.model.dtype, seed=cfg.seed, placement=cluster)  # .engines(...)

The controller cannot tell the difference: `Trainer` keeps all its command and gather logic
and only talks to `RayRank` handles instead of pipes, and `RayEngine` is an `Engine` whose
methods run in the engine actor. The ranks meet for torch.distributed on rank 0's node (its
IP, a port free there), so the same code runs on `ray start --head` on one machine and on a
multi-node cluster, where every node needs the same Python environment with rlvr installed.

The placement group's bundles are those of rlvr.planning.placement's layout, which says where
every actor goes and checks that the cluster holds them. Each engine actor (one per
`engine.replicas`, behind one `ReplicatedEngine`) holds its whole tensor-parallel group in one
bundle (so on one node) and vLLM runs the group's workers as the actor's child processes
(rlvr.engines.vllm_parallel; the why is in docs/placement.md). Trainer ranks are numbered by
node, then GPU, once Ray has placed them (`place_ranks`), so that an HSDP replica's consecutive
ranks share a node. The actors
themselves are in rlvr.orchestration.ray_actors; `rlvr rehearse` places them on a simulated
cluster (rlvr.orchestration.rehearsal).

The connection to Ray is process-wide (as `ray.init` is): the trainer and the engine share one
`RayCluster`; when the last of its actors is closed it removes the placement group and
disconnects (stopping Ray only if this process started it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from rlvr.config import EngineConfig, PlacementConfig
from rlvr.engines.base import Engine
from rlvr.models.folder import ModelFolder
from rlvr.orchestration import RunStopped
from rlvr.orchestration.ray_actors import EngineActor, RankActor
from rlvr.planning.placement import Layout, Slot, plan_layout
from rlvr.training.commands import Command
from rlvr.training.trainer import RankDied
from rlvr.training.worker import RankSpec

# A Ray started here on a laptop-sized machine: no dashboard, and an object store sized for
# adapters and rollouts rather than Ray's default of 30% of memory.
LOCAL_OBJECT_STORE_BYTES = 500 << 20
RESERVE_TIMEOUT_S = 300  # a cluster that cannot fit the placement group says so instead of hanging
STOP_TIMEOUT_S = 30


class EngineError(RuntimeError):
    pass


# ---------------------------------------------------------------------- the bundles (pure)


def bundles(layout: Layout) -> list[dict[str, float]]:
    """The placement group's bundles, in the layout's bundle order: what their slots reserve."""
    reserved = [{"CPU": 0.0, "GPU": 0.0} for _ in range(1 + max(slot.bundle for slot in layout.slots))]
    for slot in layout.slots:
        reserved[slot.bundle]["CPU"] += slot.cpus
        reserved[slot.bundle]["GPU"] += slot.reserved_gpus
    return [bundle if layout.gpus_per_node else {"CPU": bundle["CPU"]} for bundle in reserved]


def strategy(layout: Layout) -> str:
    """All on one node (STRICT_PACK) when there is one; otherwise PACK, which fills a node before
    the next so that neighbouring ranks talk over the fast local links. (SPREAD would put every
    rank on its own node: the slowest layout for FSDP's collectives.)"""
    return "STRICT_PACK" if layout.nodes == 1 else "PACK"


# ---------------------------------------------------------------------- the cluster


class RayCluster:
    """This process's connection to Ray and the run's placement group, shared by its actors:
    the last actor to go removes the group and disconnects."""

    _current: RayCluster | None = None

    @classmethod
    def shared(cls, placement: PlacementConfig, ranks: int, engines: int = 1, tp: int = 1) -> RayCluster:
        """The run's cluster, connected (and its placement group reserved) by the first caller."""
        if cls._current is None:
            cls._current = cls(placement, ranks, engines, tp)
        elif (cls._current.placement, cls._current.layout) != (
            placement,
            plan_layout(placement, ranks=ranks, engines=engines, tp=tp),
        ):
            raise ValueError("placement: a Ray placement for another configuration is still open in this process")
        return cls._current

    def __init__(self, placement: PlacementConfig, ranks: int, engines: int = 1, tp: int = 1):
        """`ranks` trainer ranks and `engines` TP-`tp` engines as rlvr.planning.placement lays them
        out (PlanError, a ValueError, where it cannot)."""
        self.placement, self.world_size, self.tp = placement, ranks, tp
        self.layout = plan_layout(placement, ranks=ranks, engines=engines, tp=tp)
        self.bundles, self.strategy = bundles(self.layout), strategy(self.layout)
        self._actors = 0
        ray = _import_ray()
        from ray.util.placement_group import placement_group

        address = placement.ray_address
        self._started_here = address is None and not ray.is_initialized()
        if self._started_here:
            ray.init(
                # "local" starts a new cluster even where RAY_ADDRESS or a stale
                # /tmp/ray/ray_current_cluster names another one.
                address="local",
                # Logical CPUs: the plan's bundles must fit even where they outnumber the cores.
                num_cpus=max(os.cpu_count() or 1, math.ceil(self.layout.cpus)),
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            )
        elif address is not None and not ray.is_initialized():
            self._join(ray, address)
        self.group = placement_group(self.bundles, strategy=self.strategy)
        if not self.group.wait(RESERVE_TIMEOUT_S):
            resources = ray.cluster_resources()
            self._disconnect()
            raise RuntimeError(
                f"placement: Ray could not reserve {self.bundles} ({self.strategy}) in "
                f"{RESERVE_TIMEOUT_S} s; the cluster has {resources}"
            )

    @staticmethod
    def _join(ray, address: str) -> None:
        try:
            ray.init(address=address)
        except (ConnectionError, RuntimeError) as error:
            cause: BaseException = error
            while cause.__cause__ is not None:
                cause = cause.__cause__
            # Ray nests the root error's traceback in the message: its last line says what failed.
            lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
            why = lines[-1] if lines else type(cause).__name__
            if "InvalidAuthToken" in str(cause):
                why = "the cluster uses token authentication: run with RAY_AUTH_MODE=token (and its token)"
            raise RunStopped(f"placement.ray_address: could not join Ray at {address!r}: {why}") from None

    def _disconnect(self) -> None:
        import ray

        RayCluster._current = None
        ray.util.remove_placement_group(self.group)
        if self._started_here:
            ray.shutdown()

    def _acquire(self) -> None:
        self._actors += 1

    def _release(self) -> None:
        self._actors -= 1
        if self._actors == 0:
            self._disconnect()

    def _abandon(self, actors: list) -> None:
        """Kill actors that never got a handle; with no other actor left, close the cluster."""
        import ray

        for actor in actors:
            ray.kill(actor)
        if self._actors == 0:
            self._disconnect()

    def _actor(self, cls, slot: Slot):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        in_bundle = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=slot.bundle)
        return ray.remote(cls).options(num_cpus=slot.cpus, num_gpus=slot.reserved_gpus, scheduling_strategy=in_bundle)

    def close(self) -> None:
        """Remove the placement group and disconnect now, whatever actors are left (a rehearsal's)."""
        self._disconnect()

    # ------------------------------------------------------------------ trainer ranks

    def place_ranks(self) -> tuple[list[Placed], tuple[str, int]]:
        """One empty actor per rank slot, in rank order (by node, then by GPU on the node), and
        the rendezvous they will meet at: rank 0's node IP and a port free there.

        Ray's PACK fills nodes but does not promise that bundle order follows node order (on a
        simulated 8-node cluster bundles 0, 13, 15 and 16 shared a node). HSDP lays its replicas
        out rank by rank (rlvr.training.worker), so ranks numbered by bundle could put one shard
        group on two nodes; numbered by node, each group of shard_ranks <= gpus_per_node
        consecutive ranks stays on one."""
        import ray

        actors = [(self._actor(RankActor, slot).remote(), slot.bundle) for slot in self.layout.trainers]
        try:
            wheres = ray.get([actor.where.remote() for actor, _ in actors])
            placed = [Placed(actor, bundle, where) for (actor, bundle), where in zip(actors, wheres)]
            nodes = number_nodes(placed)
            ranks = sorted(placed, key=lambda p: (nodes[p.where["node_id"]], p.where["gpus"], p.bundle))
            return ranks, ray.get(ranks[0].actor.rendezvous.remote())
        except ray.exceptions.RayActorError as error:
            self._abandon([actor for actor, _ in actors])
            raise RuntimeError(f"a trainer rank could not start as a Ray actor ({_death(error)})") from None

    def launch_ranks(self, world_size: int, spec: RankSpec) -> list[RayRank]:
        """`Trainer`'s launch: one actor per rank, ordered by node, meeting on rank 0's node."""
        if world_size != self.world_size:
            raise ValueError(f"placement planned {self.world_size} trainer ranks, not {world_size}")
        ranks, (address, port) = self.place_ranks()
        return [
            RayRank(placed.actor, placed.actor.start.remote(rank, world_size, address, port, spec), self)
            for rank, placed in enumerate(ranks)
        ]

    # ------------------------------------------------------------------ engine

    def place_engine(self, engine: EngineConfig, replica: int = 0) -> Placed:
        """Engine `replica`'s empty actor in its slot, holding its whole TP group: vLLM runs the
        group's workers as the actor's child processes (rlvr.engines.vllm_parallel)."""
        import ray

        if engine.tensor_parallel_size != self.tp:
            self._abandon([])
            raise ValueError(
                f"placement planned TP-{self.tp} engines, not engine.tensor_parallel_size={engine.tensor_parallel_size}"
            )
        slot = self.layout.engines[replica]
        actor = self._actor(EngineActor, slot).remote()
        try:
            where = ray.get(actor.where.remote(engine))
        except ray.exceptions.RayError as error:
            self._abandon([actor])
            raise EngineError(f"the engine actor failed to start:\n{error}") from None
        return Placed(actor, slot.bundle, where)

    def engines(self, folder: ModelFolder, engine: EngineConfig, *, seeds: list[int], **options) -> list[RayEngine]:
        """One engine per slot of the plan (`seeds[i]` for replica i), each built by `make_engine`
        inside its actor; they start side by side. One that fails takes the others down with it."""
        if len(seeds) != len(self.layout.engines):
            raise ValueError(f"placement planned {len(self.layout.engines)} engine(s), not {len(seeds)}")
        self._acquire()  # held while starting, so that no failure below disconnects under the others
        placed, started, handed = [], [], 0
        try:
            for replica in range(len(seeds)):
                placed.append(self.place_engine(engine, replica))
            starts = [p.actor.start.remote(folder, engine, {**options, "seed": seed}) for p, seed in zip(placed, seeds)]
            for p, start in zip(placed, starts):
                handed += 1  # a RayEngine that fails to start kills its own actor
                started.append(RayEngine(p.actor, start, self))
            return started
        except BaseException:
            self._abandon([p.actor for p in placed[handed:]])
            for running in started:
                running.close()
            raise
        finally:
            self._release()


@dataclass(frozen=True)
class Placed:
    """An actor and where Ray put it: `where` is its node_id, ip, gpus (indices on the node) and
    cuda_visible_devices (and for the engine, the executor_backend vLLM resolves there)."""

    actor: Any  # a Ray actor handle: its methods are the actor class's, looked up when called
    bundle: int
    where: dict


def number_nodes(placed: list[Placed]) -> dict[str, int]:
    """Ray's node ids numbered 0, 1, ... by the lowest bundle each node hosts."""
    nodes: dict[str, int] = {}
    for p in sorted(placed, key=lambda p: p.bundle):
        nodes.setdefault(p.where["node_id"], len(nodes))
    return nodes


def _import_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray would otherwise report usage over the network
    try:
        import ray
    except ImportError:
        raise ImportError("placement.backend: ray needs the ray package: pip install 'rlvr[ray]'") from None
    return ray


def _death(error) -> str:
    """Ray's multi-line account of a dead actor in one line: which process, where, and why."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    fields = dict(line.split(": ", 1) for line in lines[1:] if line.split(":")[0] in _DEATH_FIELDS)
    why = next((line for line in lines[1:] if line.split(":")[0] not in _DEATH_FIELDS), lines[0] if lines else "")
    where = f"pid {fields['pid']}" if "pid" in fields else "process unknown"
    where += f" on {fields['ip']}" if "ip" in fields else ""
    return f"Ray actor, {where}: {why}"


_DEATH_FIELDS = ("class_name", "actor_id", "pid", "name", "namespace", "ip")


# ---------------------------------------------------------------------- handles


class RayRank:
    """The controller's end of a rank actor; see `RankHandle`."""

    def __init__(self, actor, pending, cluster: RayCluster):
        self._actor, self._pending, self._cluster = actor, pending, cluster
        cluster._acquire()

    def send(self, command: Command) -> None:
        self._pending = self._actor.call.remote(command)

    def receive(self, timeout_s: float | None) -> tuple[str, object]:
        import ray

        try:
            return ray.get(self._pending, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError from None
        except ray.exceptions.RayActorError as error:
            raise RankDied(_death(error)) from None

    def stop(self) -> None:
        self._pending = self._actor.close.remote()

    def wait_stopped(self) -> None:
        import ray

        try:
            ray.get(self._pending, timeout=STOP_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # gone already, or stuck: killed below either way
        ray.kill(self._actor)
        self._cluster._release()


class RayEngine(Engine):
    """An `Engine` whose every method runs in the engine actor."""

    def __init__(self, actor, started, cluster: RayCluster):
        """`started`: the actor's pending `start`, which builds the engine and gives its name."""
        import ray

        self._actor, self._cluster = actor, cluster
        cluster._acquire()
        try:
            self.name = self._get(started, "start")
            self.policy_version = self._call("policy_version")  # the engine's: read again after each update
        except ray.exceptions.RayTaskError as error:  # the engine could not be built: its own traceback says why
            self.close()
            raise EngineError(f"the engine actor failed to start:\n{error}") from None
        except BaseException:
            self.close()
            raise

    def generate(self, prompts, n, sampling, *, progress=None, **kwargs):
        # a progress callback draws on this process's console: it cannot travel to the actor
        rollouts = self._call("generate", prompts, n, sampling, **kwargs)
        if progress is not None:
            progress(len(rollouts))
        return rollouts

    def submit(self, requests, **kwargs) -> None:
        self._call("submit", list(requests), **kwargs)

    def poll(self):
        return self._call("poll")

    @property
    def pending(self) -> int:
        return self._call("pending")

    def score(self, sequences, prompt_lens):
        return self._call("score", sequences, prompt_lens)

    def update_lora(self, adapter) -> None:
        self._call("update_lora", adapter)
        self.policy_version = self._call("policy_version")

    def update_weights(self, named_tensors, version: int | None = None) -> None:
        self._call("update_weights", list(named_tensors), version)
        self.policy_version = self._call("policy_version")

    def sleep(self) -> None:
        self._call("sleep")

    def wake(self) -> None:
        self._call("wake")

    def close(self) -> None:
        actor, self._actor = self._actor, None
        if actor is None:
            return
        import ray

        try:
            ray.get(actor.call.remote("close", (), {}), timeout=STOP_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # gone already, or stuck: killed below either way
        ray.kill(actor)
        self._cluster._release()

    def _call(self, method: str, *args, **kwargs):
        if self._actor is None:
            raise EngineError(f"the engine actor is closed: cannot {method}")
        return self._get(self._actor.call.remote(method, args, kwargs), method)

    def _get(self, pending, operation: str):
        import ray

        try:
            return ray.get(pending)
        except ray.exceptions.RayActorError as error:
            raise EngineError(f"the engine actor died ({_death(error)}) during {operation}; the run stops") from None
