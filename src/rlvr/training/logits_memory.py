"""How many scored tokens the LM head computes logits for at once: a byte budget over the vocabulary.

A scored token's logits are V values (V ~ 150k: 0.6 MB in float32), and reading them
(rlvr.algorithms.logits) holds two float32 copies beside them: the log-softmax and the
probabilities. A softcapped head (Gemma 2's final_logit_softcapping) also holds its logits
before the cap, in backward's recomputation too. So the trainer ranks
(rlvr.training.policy.TokenLogprobs) score `chunk_tokens` tokens at a time, whose logits
working set is `trainer.logits_chunk_mb`, whatever the vocabulary and dtype; and the plan
(rlvr.planning.architecture) counts that working set. Torch-free, for the plan.
"""

from __future__ import annotations

FLOAT32_COPIES = 2  # the log-softmax and the probabilities (rlvr.algorithms.logits)


def bytes_per_token(vocab_size: int, dtype_bytes: int, softcapped: bool = False) -> int:
    """One scored token's share of the logits working set: its logits in the compute dtype (twice
    when softcapped) and the float32 copies."""
    return vocab_size * (dtype_bytes * (2 if softcapped else 1) + 4 * FLOAT32_COPIES)


def chunk_tokens(budget_bytes: float, vocab_size: int, dtype_bytes: int, softcapped: bool = False) -> int:
    """Tokens whose logits working set fits `budget_bytes` (at least one)."""
    return max(1, int(budget_bytes // bytes_per_token(vocab_size, dtype_bytes, softcapped)))


def working_bytes(tokens: int, budget_bytes: float, vocab_size: int, dtype_bytes: int, softcapped: bool = False) -> int:
    """The logits working set of `tokens` scored tokens: one chunk's, or all of them if fewer."""
    chunk = chunk_tokens(budget_bytes, vocab_size, dtype_bytes, softcapped)
    return min(tokens, chunk) * bytes_per_token(vocab_size, dtype_bytes, softcapped)
