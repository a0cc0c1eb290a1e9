"""The rank pipe's message format: tensors travel as their bytes, every dtype exactly."""

import multiprocessing as mp

import pytest
import torch

from rlvr.training import wire


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float8_e4m3fn,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
)
def test_tensors_of_every_dtype_cross_the_pipe_bit_for_bit(dtype):
    source = (torch.randn(3, 5) * 10).to(dtype)
    message = ("ok", {"t": source, "view": source.t(), "scalar": source[1, 2], "empty": source[:0], "nested": [source]})
    a, b = mp.Pipe()
    wire.send(a, message)
    status, got = wire.receive(b)
    assert status == "ok"
    for key in ("t", "view", "scalar", "empty"):
        want = message[1][key]
        assert got[key].dtype == dtype and got[key].shape == want.shape
        assert torch.equal(_bits(got[key]), _bits(want))  # bit for bit, NaNs included
    assert torch.equal(_bits(got["nested"][0]), _bits(source))
    before = _bits(source).clone()
    got["view"].reshape(-1).view(torch.uint8).add_(1)  # writable, and its own memory
    assert torch.equal(_bits(source), before)


def test_a_parameter_that_requires_grad_arrives_as_a_plain_tensor():
    a, b = mp.Pipe()
    wire.send(a, torch.nn.Parameter(torch.ones(2)))
    got = wire.receive(b)
    assert type(got) is torch.Tensor and not got.requires_grad and torch.equal(got, torch.ones(2))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)
