"""`model.dtype: auto`: bfloat16 where the device computes it natively, float32 elsewhere."""

import pytest
import torch

from rlvr.hardware import compute_dtype, native_bf16


def test_auto_follows_what_torch_reports_of_this_cpu():
    capabilities = torch.cpu.get_capabilities()
    native = capabilities.get("amx_bf16") or capabilities.get("avx512_bf16")
    chosen = compute_dtype("auto", "cpu")
    assert chosen.name == ("bfloat16" if native else "float32")
    assert chosen.line() == f"compute: {chosen.name} ({chosen.reason})"
    assert chosen.torch == getattr(torch, chosen.name)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"amx_bf16": True, "avx512_bf16": True}, ("bfloat16", "CPU with AMX")),
        ({"amx_bf16": False, "avx512_bf16": True}, ("bfloat16", "CPU with AVX512-BF16")),
        ({"avx2": True}, ("float32", "CPU without native bf16")),  # emulated bf16 runs several times slower
    ],
)
def test_auto_on_a_cpu_with_and_without_bf16_units(monkeypatch, flags, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    chosen = compute_dtype("auto", "cpu")
    assert (chosen.name, chosen.reason) == expected


def test_a_dtype_asked_for_is_taken_and_a_planned_gpu_computes_bf16():
    assert compute_dtype("float32", "cpu").name == "float32" and compute_dtype("bfloat16", "cpu").name == "bfloat16"
    if not torch.cuda.is_available():  # a GPU placement planned from here (--dry-run): the GPUs have bf16
        assert native_bf16("cuda") == "CUDA" and compute_dtype("auto", "cuda").name == "bfloat16"


# solo: it compares two rates measured one after the other, which another test's load in
# between would skew (beside a busy worker, bf16 came out 1.6x float32 instead of > 2x)
@pytest.mark.solo
def test_cpu_rates_are_measured_once_and_cached(tmp_path):
    """The real calibration, on one thread: sane rates, written under the CPU's name, the thread
    count and torch's version, and read back rather than measured again."""
    import json
    import time

    from rlvr.hardware import cpu_rates

    cache = tmp_path / "cpu_rates.json"
    measured = cpu_rates(1, cache)
    (key,) = json.loads(cache.read_text())
    assert "| 1 threads |" in key and torch.__version__ in key
    assert measured.float32_flops > 1e9 and measured.memory_bytes_per_s > 1e9 and measured.loopback_bytes_per_s > 1e8
    if native_bf16("cpu") == "CPU with AMX":  # the tile units multiply bf16 several times faster than AVX-512 float32
        assert measured.bfloat16_flops > 2 * measured.float32_flops
    start = time.perf_counter()
    assert cpu_rates(1, cache) == measured and time.perf_counter() - start < 0.1
