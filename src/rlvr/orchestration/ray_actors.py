"""What runs inside the Ray actors of placement `ray` (rlvr.orchestration.ray_placement drives them).

An actor starts empty and cheap: Ray imports this module in every worker process, so it imports
neither torch nor vLLM at the top. Each actor first says where Ray put it (`where`), so that the
controller can order the trainer ranks by node before any of them joins torch.distributed and a
rehearsal can record the layout without loading anything; only `start` builds a rank's shard or
the engine.
"""

from __future__ import annotations

import os
import signal


def _where() -> dict:
    """This actor's node, the GPUs Ray gave it (indices on that node) and the environment its
    CUDA code would start with."""
    import ray

    context = ray.get_runtime_context()
    return {
        "node_id": context.get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "gpus": sorted(int(gpu) for gpu in context.get_accelerator_ids().get("GPU", [])),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


class RankActor:
    """Hosts one trainer rank (the same code a local rank process runs) inside a Ray worker."""

    def __init__(self):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's: it stops between steps
        self.worker = None

    def where(self) -> dict:
        return _where()

    def rendezvous(self) -> tuple[str, int]:
        import ray

        from rlvr.training.trainer import free_port

        return ray.util.get_node_ip_address(), free_port()

    def start(self, rank: int, world_size: int, address: str, port: int, spec) -> tuple[str, object]:
        from rlvr.training.rank_host import RankFailure, join_group

        try:
            self.worker = join_group(rank, world_size, address, port, spec)
            return "ok", self.worker.info()
        except Exception as error:
            return "error", RankFailure.of(error)

    def call(self, command) -> tuple[str, object]:
        """One rlvr.training.commands record, answered as a local rank answers it."""
        from rlvr.training.rank_host import answer

        return answer(self.worker, command)

    def close(self) -> None:
        from rlvr.training.rank_host import leave_group

        leave_group()


class EngineActor:
    """Hosts an engine from `make_engine` inside a Ray worker."""

    def __init__(self):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.engine = None

    def where(self, engine) -> dict:
        """Also, for a vLLM engine, the executor vLLM would run its workers with here: vLLM's own
        `ParallelConfig`, given the options the engine passes and this actor's placement group
        (as vLLM's EngineArgs does inside a Ray actor)."""
        if engine.backend != "vllm":
            return {**_where(), "executor_backend": None}
        import ray
        from vllm.config import ParallelConfig

        from rlvr.engines.vllm_parallel import executor_backend

        parallel = ParallelConfig(
            tensor_parallel_size=engine.tensor_parallel_size,
            distributed_executor_backend=executor_backend(engine.tensor_parallel_size),
            placement_group=ray.util.get_current_placement_group(),
        )
        return {**_where(), "executor_backend": parallel.distributed_executor_backend}

    def start(self, folder, engine, options: dict) -> str:
        from rlvr.engines import make_engine

        self.engine = make_engine(folder, engine, **options)
        return self.engine.name

    def call(self, method: str, args: tuple, kwargs: dict):
        attribute = getattr(self.engine, method)
        return attribute(*args, **kwargs) if callable(attribute) else attribute  # a property (pending): its value
