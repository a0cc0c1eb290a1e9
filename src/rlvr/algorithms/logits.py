"""Per-token quantities read from logits [..., V]: the logprob of chosen tokens and the entropy.

Logits of a batch of long completions are the largest tensor of a step (B x T x V, V ~ 150k),
so neither function materialises a full log-softmax: they walk the flattened tokens in chunks
and use logsumexp. Half-precision logits are upcast per chunk (a bf16 logsumexp loses ~3
digits), so results are float32 for bf16/fp16 inputs and keep float32/float64 otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _chunks(logits: Tensor, temperature: float, chunk_size: int):
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    dtype = logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32
    flat = logits.reshape(-1, logits.shape[-1])
    for start in range(0, flat.shape[0], chunk_size):
        chunk = flat[start : start + chunk_size].to(dtype)
        yield start, chunk / temperature if temperature != 1.0 else chunk


def token_logprobs(logits: Tensor, ids: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024) -> Tensor:
    """log softmax(logits / temperature)[ids], shape of `ids` (logits [..., V], ids [...]).

    Differentiable. Use the sampler's temperature so trainer and sampler logprobs compare.
    """
    flat_ids = ids.reshape(-1, 1)
    out = [
        chunk.gather(-1, flat_ids[start : start + chunk.shape[0]]).squeeze(-1) - chunk.logsumexp(-1)
        for start, chunk in _chunks(logits, temperature, chunk_size)
    ]
    return torch.cat(out).reshape(ids.shape)


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024) -> Tensor:
    """Entropy of softmax(logits / temperature) per token, in nats, shape logits.shape[:-1].

    H = -sum_v p_v log p_v with log p = z - logsumexp(z): a sum of non-negative terms, which
    keeps float32 digits that the shorter logsumexp(z) - sum_v p_v z_v cancels away for large z.
    Differentiable (for an entropy bonus); wrap in torch.no_grad() when only logging it.
    """
    out = []
    for _, chunk in _chunks(logits, temperature, chunk_size):
        logp = chunk - chunk.logsumexp(-1, keepdim=True)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out).reshape(logits.shape[:-1])
