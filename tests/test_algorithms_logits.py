"""Token logprobs and entropy from logits, chunked, against closed forms and full softmax."""

import math

import pytest
import torch
import torch.nn.functional as F

from rlvr.algorithms import entropy_from_logits, logprobs_and_entropy, token_logprobs


def test_by_hand():
    # logits log(1, 2, 3) -> p = (1/6, 2/6, 3/6)
    logits = torch.tensor([[[0.0, math.log(2), math.log(3)]]], dtype=torch.float64)
    assert token_logprobs(logits, torch.tensor([[2]])).item() == pytest.approx(math.log(0.5))
    h = -(1 / 6 * math.log(1 / 6) + 2 / 6 * math.log(2 / 6) + 3 / 6 * math.log(3 / 6))
    assert entropy_from_logits(logits).item() == pytest.approx(h)
    # uniform over V has entropy log V; temperature 2 halves the logits
    assert entropy_from_logits(torch.zeros(1, 7)).item() == pytest.approx(math.log(7))
    half = torch.tensor([[0.0, math.log(4)]], dtype=torch.float64)  # /2 -> log(1, 2) -> p = (1/3, 2/3)
    assert token_logprobs(half, torch.tensor([1]), temperature=2.0).item() == pytest.approx(math.log(2 / 3))


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_chunks_match_full_softmax_and_gradients_flow(chunk_size):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 11, (2, 5), generator=gen)
    logp = F.log_softmax(logits, -1)
    torch.testing.assert_close(
        token_logprobs(logits, ids, chunk_size=chunk_size), logp.gather(-1, ids[..., None])[..., 0]
    )
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=chunk_size), -(logp.exp() * logp).sum(-1))
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, ids, chunk_size=chunk_size), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, chunk_size=chunk_size), (logits,))


def test_bf16_logits_are_upcast():
    logits = torch.randn(3, 50).to(torch.bfloat16)
    ids = torch.tensor([1, 2, 3])
    out = token_logprobs(logits, ids)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.log_softmax(logits.float(), -1).gather(-1, ids[:, None])[:, 0])
    assert entropy_from_logits(logits).dtype == torch.float32


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
def test_logprobs_and_entropy_in_chunks_equal_one_full_softmax(chunk_size, temperature):
    """Both at once, chunked, against log_softmax over the whole tensor: the values, and the
    gradient of a loss that uses both (the entropy bonus's path, and the pure logprob one)."""
    gen = torch.Generator().manual_seed(1)
    logits = 4 * torch.randn(3, 4, 13, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, 13, (3, 4), generator=gen)
    weights = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)

    def full(x):
        logp = F.log_softmax(x / temperature, -1)
        return logp.gather(-1, ids[..., None])[..., 0], -(logp.exp() * logp).sum(-1)

    def chunked(x):
        return logprobs_and_entropy(x, ids, temperature=temperature, chunk_size=chunk_size)

    before = logits.clone()
    picked, entropy = chunked(logits)
    assert torch.equal(logits, before)  # read, never overwritten
    torch.testing.assert_close(picked, full(logits)[0])
    torch.testing.assert_close(entropy, full(logits)[1])
    for loss in (lambda lp, h: (weights[0] * lp + weights[1] * h).sum(), lambda lp, h: (weights[0] * lp).sum()):
        x, y = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        loss(*chunked(x)).backward()
        loss(*full(y)).backward()
        torch.testing.assert_close(x.grad, y.grad)
    assert torch.autograd.gradcheck(lambda x: chunked(x), (logits.clone().requires_grad_(),))


def test_a_half_precision_chunk_keeps_its_gradient_dtype_and_its_input():
    logits = torch.randn(5, 40).to(torch.bfloat16).requires_grad_()
    before = logits.detach().clone()
    picked, entropy = logprobs_and_entropy(logits, torch.arange(5), temperature=0.5, chunk_size=2)
    picked.sum().backward()
    assert picked.dtype == entropy.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    assert torch.equal(logits.detach(), before)  # the float32 copy is overwritten, never the caller's logits
    reference = F.log_softmax(logits.detach().float() / 0.5, -1)
    torch.testing.assert_close(picked, reference.gather(-1, torch.arange(5)[:, None])[:, 0])
    torch.testing.assert_close(
        logits.grad.float(), ((F.one_hot(torch.arange(5), 40) - reference.exp()) / 0.5), atol=1e-2, rtol=1e-2
    )
