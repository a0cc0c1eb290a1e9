"""megatron-core's process groups over the ranks' torch.distributed group, on CUDA or on CPU.

On a CPU rank two things stand in for CUDA: megatron-core asks `torch.cuda.current_device()`
for the device of the tensors it makes itself (rotary angles, buffers), which a CPU build of
torch cannot answer, so it is told "cpu"; and no CUDA RNG tracker is seeded (its dropout forks
need CUDA; rlvr's Megatron models run without dropout)."""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from rlvr.config import MegatronConfig


def start_model_parallel(layout: MegatronConfig, use_cuda: bool) -> None:
    """Megatron's tensor/expert/pipeline/data groups over the already-joined world."""
    if not use_cuda:
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tensor_parallel,
        pipeline_model_parallel_size=layout.pipeline_parallel,
        expert_model_parallel_size=layout.expert_parallel,
        create_gloo_process_groups=use_cuda,  # on CPU the groups are gloo already
    )


def tensor_rank() -> tuple[int, int]:
    """(this rank's index in its tensor-parallel group, the group's size)."""
    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()


def expert_rank() -> tuple[int, int]:
    """(this rank's index in its expert-parallel group, the group's size)."""
    return parallel_state.get_expert_model_parallel_rank(), parallel_state.get_expert_model_parallel_world_size()


def stop_model_parallel() -> None:
    parallel_state.destroy_model_parallel()
