"""Which cores each process of a run on one CPU machine gets: the CPU form of a split placement.

    split = cpu_split(cfg, allowed_cores())
    split.controller, split.ranks      # cores: the controller with its engine; each trainer rank's
    split.engine_threads, split.rank_threads
    split.warning                      # one line where threads outnumber the cores they run on

On GPUs a split placement (`placement.colocate: false`) gives the engine GPUs of its own
(`placement.engine_gpus`) and the trainer ranks the others, so that with `rollout.max_staleness`
>= 1 generation and training overlap for real. On one CPU machine the same thing is cores of
their own, `placement.engine_cpus`:

- The controller and its engine get the first engine_cpus cores this run may use. On CPU the
  engine runs inside the controller (vLLM in-process, transformers' generate), or in an engine
  core process the controller starts, which inherits its cores. The controller's own work
  stays there with it, by choice: that work is the rollout side's. vLLM's scheduler, sampler
  and output handling run in Python on the controller's thread between the engine's forwards,
  and the verifier workers, started by the controller (and inheriting its cores), score the
  rollouts as they come. The ranks' steps are long matmuls tied together by collectives: a
  controller thread landing on a rank's core would stall that rank, and every rank waits for
  the slowest. A GPU cluster places the controller the same way, on the engine's host CPUs.
- The trainer ranks get the cores left. Where the ranks divide them, each rank gets a share of
  its own (as each gets a GPU of its own); else they share them all. A rank runs a torch thread
  per core it has, at least one (rank_threads).
- The engine runs a thread per core it has, unless engine.num_threads says otherwise.

Without engine_cpus every process may run on every core (no pinning), with the engines' and
the Trainer's own thread counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.affinity import core_list, rank_threads
from rlvr.engines.base import cpu_threads
from rlvr.planning.sections import PlanSections


@dataclass
class CpuSplit:
    split: bool  # placement.engine_cpus: each side pinned to its cores
    controller: list[int]  # the controller and its engine
    ranks: list[list[int]]  # per trainer rank
    engine_threads: int
    rank_threads: int  # per rank
    warning: str | None  # one line: threads outnumber the cores they run on

    def describe(self) -> str:
        """One line: which cores run what, with how many threads."""
        if len({tuple(cores) for cores in self.ranks}) == 1:
            each = " each" if len(self.ranks) > 1 else ""
            ranks = f"{_count(len(self.ranks), 'trainer rank')} on {_cores(self.ranks[0])}, {_count(self.rank_threads, 'thread')}{each}"
        else:
            ranks = ", ".join(f"trainer rank {i} on {_cores(cores)}" for i, cores in enumerate(self.ranks))
            ranks += f", {_count(self.rank_threads, 'thread')} each"
        how = "split (placement.engine_cpus)" if self.split else "shared, not pinned"
        return f"cores: {how}: controller + engine on {_cores(self.controller)}, {_count(self.engine_threads, 'thread')}; {ranks}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _cores(cores: list[int]) -> str:
    return f"core{'s' * (len(cores) != 1)} {core_list(cores)}"


def cpu_split(cfg: PlanSections, allowed: list[int]) -> CpuSplit:
    """The cores and threads of the controller (with its engine) and of each trainer rank, out of
    the `allowed` cores this run may use (rlvr.affinity.allowed_cores), as the module doc-string says."""
    ranks, wanted = cfg.trainer.ranks, cfg.placement.engine_cpus
    problems = []
    controller, left = (allowed, []) if wanted is None else (allowed[:wanted], allowed[wanted:])
    own = bool(left)  # the ranks have cores of their own
    if wanted is None:
        engine_threads = cpu_threads(cfg.engine, len(allowed))
    else:
        if not own:
            problems.append(
                f"placement.engine_cpus={wanted} leaves none of the {len(allowed)} cores this run may use "
                f"({core_list(allowed)}) to the trainer ranks, which share the engine's"
            )
        engine_threads = cfg.engine.num_threads or len(controller)
        if engine_threads > len(controller):
            problems.append(
                f"engine.num_threads={engine_threads} on the engine's {len(controller)} "
                f"core{'s' * (len(controller) != 1)}"
            )
    left = left or allowed
    per_rank = rank_threads(len(left), ranks)
    if own and len(left) % ranks == 0:
        share = len(left) // ranks
        rank_cores = [left[i * share : (i + 1) * share] for i in range(ranks)]
    else:
        rank_cores = [left] * ranks
    if ranks * per_rank > len(left):
        problems.append(
            f"trainer.ranks={ranks} ({ranks * per_rank} threads) on {len(left)} "
            f"core{'s' * (len(left) != 1)} ({core_list(left)})"
        )
    # a mode that generates ahead runs the engine while the ranks train (None: the phases take turns,
    # or a served model, whose client samples when it asks)
    ahead = cfg.steps.rollout.mode if cfg.steps is not None and cfg.steps.rollout.max_staleness > 0 else None
    if wanted is None and ahead is not None and engine_threads + ranks * per_rank > len(allowed):
        problems.append(
            f"the engine's {engine_threads} thread{'s' * (engine_threads != 1)} and trainer.ranks={ranks} "
            f"x {per_rank} run at once (rollout.mode: {ahead}) on {len(allowed)} cores; "
            "placement.colocate: false with placement.engine_cpus gives each its own"
        )
    warning = f"cores oversubscribed: {'; '.join(problems)}" if problems else None
    return CpuSplit(wanted is not None, controller, rank_cores, engine_threads, per_rank, warning)
