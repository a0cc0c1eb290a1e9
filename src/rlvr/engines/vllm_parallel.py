"""How vLLM runs an engine's tensor-parallel workers: as child processes of the engine's own
process ("mp"), never as Ray actors of their own.

Under placement `ray` the engine is one actor that owns its TP group's GPUs, all in one bundle
and so on one node; Ray starts it with those GPUs in CUDA_VISIBLE_DEVICES, and vLLM's mp workers
inherit that and take GPU `local_rank` of it (vllm/v1/worker/gpu_worker.py, init_device). Left
to itself inside a placement group, vLLM would pick its Ray executor, which refuses a bundle with
more than one GPU (vllm/v1/executor/ray_utils.py). docs/placement.md says why mp over one bundle
per GPU.
"""


def executor_backend(tensor_parallel_size: int) -> str:
    """vLLM's `distributed_executor_backend` for an engine of this TP size ("uni": the one
    worker in the engine core's process, what vLLM picks itself for TP 1)."""
    return "mp" if tensor_parallel_size > 1 else "uni"
