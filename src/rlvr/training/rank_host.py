"""What hosts a trainer rank: a local process (`run_rank`, spoken to over a pipe) or a Ray actor
(rlvr.orchestration.ray_actors); either joins the ranks' torch.distributed group with
`join_group` and answers each command with `answer`, a failure as a `RankFailure`."""

from __future__ import annotations

import os
import signal
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlvr.affinity import pin_process
from rlvr.process_names import name_process, rank_name
from rlvr.training import wire
from rlvr.training.commands import Close, Command
from rlvr.training.worker import Rank, RankSpec


def run_rank(rank: int, world_size: int, port: int, spec: RankSpec, conn) -> None:
    """A local rank process: join the group, then answer commands from `conn` until `Close`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's: it stops between steps
    name_process(rank_name(rank))
    try:
        worker = join_group(rank, world_size, "127.0.0.1", port, spec)
        wire.send(conn, ("ok", worker.info()))
        while True:
            command = wire.receive(conn)
            if isinstance(command, Close):
                wire.send(conn, ("ok", None))
                break
            wire.send(conn, answer(worker, command))
    except Exception as error:
        wire.send(conn, ("error", RankFailure.of(error)))
    finally:
        leave_group()


def join_group(rank: int, world_size: int, master_addr: str, port: int, spec: RankSpec) -> Rank:
    """Join the ranks' torch.distributed group (rank 0 listens on master_addr:port) and build
    this rank's shard of the policy. Whatever hosts the rank (a process, a Ray actor) calls this."""
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(port))
    if spec.cores is not None:  # before gloo starts its threads: they inherit the mask
        pin_process(spec.cores[rank])
    torch.set_num_threads(spec.threads)
    use_cuda = torch.cuda.is_available()
    if not use_cuda:  # activations live in host memory: measured, a step's page faults cost ~8% of it
        keep_freed_memory()
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    if spec.trainer.backend == "megatron":  # megatron-core is imported by its ranks alone
        from rlvr.training.megatron.rank import MegatronRank

        return MegatronRank(rank, world_size, spec, use_cuda)
    return Rank(rank, world_size, spec, use_cuda)


# Blocks up to this size are served from the heap and kept there for the next step: a demo
# rank's activations (at most ~7 MB: 3,200 tokens x a 512-wide MLP in float32). Larger ones are
# mapped for their own use and unmapped when freed.
KEPT_BLOCK_BYTES = 8 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h


def keep_freed_memory() -> None:
    """Keep the small blocks a training step frees in this process's heap for the next step,
    and give the large ones back.

    By default glibc serves each block over 128 KiB (an activation, a gradient) with its own
    mmap and unmaps it when freed, so every step faults all of its activation pages back in:
    12-20k page faults a step on a demo rank, where the first write of each page costs more
    than the elementwise op that writes it. With blocks up to KEPT_BLOCK_BYTES served from the
    heap, and the heap never trimmed, a step reuses the last one's pages (under 3 faults a step).
    Larger blocks stay mapped and go back to the system when freed: a real model's activations,
    its dequantized weights and the LM head's logits chunk. Kept in a never-trimmed heap, the
    transient ones, freed between tensors saved for backward, leave holes the next do not fit,
    the heap grows to their sum, and the rank holds its step's peak while it waits for the next
    (a 0.5B Qwen's rank: 5.2 GiB in bf16, 8.6 in float32, through the engine's generate phase).
    Only glibc has `mallopt`; elsewhere (musl, macOS) this does nothing."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError, TypeError):
        return
    mallopt(_M_MMAP_THRESHOLD, KEPT_BLOCK_BYTES)
    mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)


@dataclass
class RankFailure:
    """What a rank's exception tells the controller: one line, the traceback, whose fault."""

    line: str  # "OSError: [Errno 28] No space left on device: '...'"
    traceback: str
    user_error: bool  # bad input or a full disk (rlvr.errors), not a bug

    @classmethod
    def of(cls, error: BaseException) -> RankFailure:
        from rlvr.errors import user_error_line

        line = (
            user_error_line(error)
            or f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        )
        return cls(line, traceback.format_exc(), user_error_line(error) is not None)


def answer(worker: Rank, command: Command) -> tuple[str, object]:
    """Run one command; ("ok", result), or ("error", RankFailure) for the controller to raise."""
    try:
        return "ok", worker.handle(command)
    except Exception as error:
        return "error", RankFailure.of(error)


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
