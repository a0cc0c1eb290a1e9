"""Per-token quantities read from logits [..., V]: the logprob of chosen tokens and the entropy.

Logits are the largest tensors of a step: a token's row is V values (V ~ 150k: 0.6 MB in
float32). Both quantities come from one pass over each chunk of `chunk_size` tokens, which
holds at most two float32 [chunk, V] tensors beside the chunk's logits, in forward and in
backward: the log-softmax (kept for backward) and its exponential, the probabilities. A
log_softmax followed by a gather, and the entropy's `p * log p`, would hold three or four.
Callers that compute the logits themselves (rlvr.training.policy.TokenLogprobs) give one chunk
at a time, sized by rlvr.training.logits_memory. Half-precision logits are upcast per chunk (a
bf16 logsumexp loses ~3 digits), so results are float32 for bf16/fp16 inputs and keep
float32/float64 otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _LogprobsAndEntropy(torch.autograd.Function):
    """One chunk: logits [C, V], ids [C] -> (log p[ids] [C], entropy [C]), p = softmax(logits / T).

    Backward, from the saved log p alone: d log p_i / dz = onehot(i) - p, and
    dH / dz = -p (log p + H), z = logits / T."""

    @staticmethod
    def forward(ctx, logits: Tensor, ids: Tensor, temperature: float):
        ctx.set_materialize_grads(False)
        own = logits.dtype not in (torch.float32, torch.float64)  # z is a copy this function may overwrite
        z = logits.float() if own else logits
        if temperature != 1.0:
            z = z.div_(temperature) if own else z / temperature
            own = True
        lse = torch.logsumexp(z, -1, keepdim=True)
        logp = z.sub_(lse) if own else z - lse
        probs = logp.exp()
        # H = -sum p log p: non-negative terms, which keep the float32 digits that the shorter
        # logsumexp(z) - sum p z cancels away for large z
        entropy = probs.mul_(logp).sum(-1).neg_()
        del probs
        picked = logp.gather(-1, ids[:, None]).squeeze(-1)
        ctx.save_for_backward(logp, ids, entropy)
        ctx.temperature, ctx.logits_dtype = temperature, logits.dtype
        return picked, entropy

    @staticmethod
    def backward(ctx, grad_picked: Tensor | None, grad_entropy: Tensor | None):
        if grad_picked is None and grad_entropy is None:
            return None, None, None
        logp, ids, entropy = ctx.saved_tensors
        grad = logp.exp()  # p
        if grad_entropy is None:
            grad.mul_(-grad_picked[:, None])
        else:
            weight = (logp + entropy[:, None]).mul_(grad_entropy[:, None])
            if grad_picked is not None:
                weight.add_(grad_picked[:, None])
            grad.mul_(weight).neg_()
            del weight
        if grad_picked is not None:
            grad.scatter_add_(-1, ids[:, None], grad_picked[:, None])
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        return grad.to(ctx.logits_dtype), None, None


def logprobs_and_entropy(
    logits: Tensor, ids: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[Tensor, Tensor]:
    """(log softmax(logits / temperature)[ids], the entropy of softmax(logits / temperature) in
    nats), both of `ids`' shape (logits [..., V], ids [...]), `chunk_size` tokens at a time.

    Differentiable in both (the entropy for an entropy bonus; its gradient takes one more
    float32 [chunk, V] tensor). Use the sampler's temperature so trainer and sampler logprobs
    compare."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    flat, flat_ids = logits.reshape(-1, logits.shape[-1]), ids.reshape(-1)
    if flat.shape[0] <= chunk_size:  # one chunk: no slice, whose backward would hold a second [tokens, V] gradient
        picked, entropy = _LogprobsAndEntropy.apply(flat, flat_ids, temperature)
    else:
        parts = [
            _LogprobsAndEntropy.apply(
                flat[start : start + chunk_size], flat_ids[start : start + chunk_size], temperature
            )
            for start in range(0, flat.shape[0], chunk_size)
        ]
        picked, entropy = torch.cat([p for p, _ in parts]), torch.cat([e for _, e in parts])
    return picked.reshape(ids.shape), entropy.reshape(ids.shape)


def token_logprobs(logits: Tensor, ids: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024) -> Tensor:
    """log softmax(logits / temperature)[ids], shape of `ids` (logits [..., V], ids [...]).

    Differentiable. Use the sampler's temperature so trainer and sampler logprobs compare.
    """
    return logprobs_and_entropy(logits, ids, temperature=temperature, chunk_size=chunk_size)[0]


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024) -> Tensor:
    """Entropy of softmax(logits / temperature) per token, in nats, shape logits.shape[:-1].

    Differentiable (for an entropy bonus); wrap in torch.no_grad() when only logging it.
    """
    ids = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return logprobs_and_entropy(logits, ids, temperature=temperature, chunk_size=chunk_size)[1]
