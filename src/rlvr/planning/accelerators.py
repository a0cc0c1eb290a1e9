"""The devices a plan can be timed on: the GPUs of `placement.gpu` at their data sheets' nominal
peaks, and this machine's CPU at the rates it measures (`cpu_accelerator`).

Peaks, not sustained rates: the step-time estimate (rlvr.planning.step_time) is what a
layout allows at best, for comparing layouts. BF16 figures are dense (NVIDIA's data sheets
print them "with sparsity", twice the dense rate); link figures are one direction.
- A100: NVIDIA A100 Tensor Core GPU data sheet (80 GB SXM): BF16 312 TFLOPS, HBM2e 2,039 GB/s;
  PCIe Gen4 x16; DGX A100 user guide: 8 ConnectX-6 HDR 200 Gb/s, one per GPU; NVLink 3 600 GB/s.
- H100: NVIDIA H100 Tensor Core GPU data sheet (SXM): BF16 1,979 TFLOPS with sparsity,
  HBM3 3.35 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s; DGX H100: 8 ConnectX-7 400 Gb/s.
- H200: NVIDIA H200 Tensor Core GPU data sheet (SXM): BF16 1,979 TFLOPS with sparsity,
  HBM3e 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s; DGX H200: 8 ConnectX-7 400 Gb/s.
- B200: NVIDIA HGX B200 data sheet (8 GPUs): FP16/BF16 36 PFLOPS with sparsity, HBM3e 64 TB/s
  aggregate, NVLink 5 1.8 TB/s per GPU; DGX B200: 8 ConnectX-7 400 Gb/s, PCIe Gen5 hosts.
- GB200: NVIDIA GB200 NVL72 data sheet (72 GPUs): FP16/BF16 360 PFLOPS with sparsity, HBM3e
  576 TB/s aggregate, NVLink 5 130 TB/s aggregate; NVLink-C2C 900 GB/s (both directions) per
  superchip, shared by its two GPUs (225 GB/s per GPU and direction); a compute tray (2
  superchips, 4 GPUs, 2 x 480 GB LPDDR5X) has a ConnectX-7 400 Gb/s per GPU.
`vllm_max_num_seqs` is vLLM 0.32's default for its offline `LLM` on that GPU
(`EngineArgs.get_batch_defaults`: 1024 for >= 70 GiB of device memory, A100 excepted, else 256).

A CPU has no data sheet here: its rates are measured once and cached (rlvr.hardware.cpu_rates,
whose doc-string says why), on the threads the engine or the trainer ranks compute with.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.hardware import CpuRates

TB = 1e12
VLLM_CPU_MAX_NUM_SEQS = 256  # vLLM 0.32's offline `LLM` on CPU: 256 x its world size (EngineArgs.get_batch_defaults)


@dataclass(frozen=True)
class Accelerator:
    matmul_flops: float  # dense matmul FLOP/s in the compute dtype (a GPU's: BF16 on its tensor cores)
    memory_bytes_per_s: float  # a GPU's HBM; a CPU's main memory
    nvlink_bytes_per_s: float  # GPU to GPU within a node, one direction
    host_bytes_per_s: float  # GPU to its host memory (PCIe or NVLink-C2C), one direction
    network_bytes_per_s: float  # the GPU's NIC to other nodes, one direction
    vllm_max_num_seqs: int
    cpu: bool = False  # this machine's cores, shared by the engine and the ranks (cpu_accelerator)


def cpu_accelerator(rates: CpuRates, dtype: str, tensor_parallel_size: int) -> Accelerator:
    """This CPU at `rates` (measured on the threads of the side it times), computing in `dtype`.
    Trainer ranks talk through gloo over loopback, within the node and beyond alike; there is no
    host link to cross (the memory is the host's)."""
    loopback = rates.loopback_bytes_per_s
    return Accelerator(
        rates.matmul_flops(dtype),
        rates.memory_bytes_per_s,
        loopback,
        rates.memory_bytes_per_s,
        loopback,
        VLLM_CPU_MAX_NUM_SEQS * tensor_parallel_size,
        cpu=True,
    )


ACCELERATORS = {
    "a100": Accelerator(312e12, 2.039 * TB, 300e9, 32e9, 25e9, 256),
    "h100": Accelerator(1979e12 / 2, 3.35 * TB, 450e9, 64e9, 50e9, 1024),
    "h200": Accelerator(1979e12 / 2, 4.8 * TB, 450e9, 64e9, 50e9, 1024),
    "b200": Accelerator(36e15 / 8 / 2, 64 * TB / 8, 900e9, 64e9, 50e9, 1024),
    "gb200": Accelerator(360e15 / 72 / 2, 576 * TB / 72, 900e9, 225e9, 50e9, 1024),
}
