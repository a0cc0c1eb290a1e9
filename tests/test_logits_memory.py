"""The LM head's chunks follow a byte budget, and chunking changes nothing: the logprobs, the
entropy and the gradients of chunks of a few tokens equal those of one chunk."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlvr.config import TrainerConfig
from rlvr.models.tiny import tiny_config
from rlvr.training.logits_memory import bytes_per_token, chunk_tokens, working_bytes
from rlvr.training.policy import TokenLogprobs


def test_a_chunk_is_the_budget_over_a_tokens_logits_and_their_two_float32_copies():
    budget = TrainerConfig().logits_chunk_mb * 1e6
    assert bytes_per_token(151936, 4) == 151936 * (4 + 8)
    assert chunk_tokens(budget, 151936, 4) == 512_000_000 // (151936 * 12) == 280  # Qwen2.5's vocabulary, float32
    assert chunk_tokens(budget, 151936, 2) == 512_000_000 // (151936 * 10) == 336  # bfloat16 logits
    assert chunk_tokens(budget, 151936, 2, softcapped=True) == 280  # the capped and the uncapped logits
    assert chunk_tokens(1, 151936, 4) == 1  # never none
    assert working_bytes(100, budget, 151936, 4) == 100 * 151936 * 12  # fewer scored tokens than a chunk
    assert working_bytes(4096, budget, 151936, 4) == 280 * 151936 * 12 <= budget


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_token_logprobs_in_chunks_of_three_equal_one_chunk(temperature):
    torch.manual_seed(0)
    vocab = 320
    model = AutoModelForCausalLM.from_config(
        tiny_config(
            "qwen2", vocab_size=vocab, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
        )
    )
    small, whole = TokenLogprobs(model, 3 * bytes_per_token(vocab, 4) / 1e6), TokenLogprobs(model, 1e3)
    assert (small.chunk_tokens(torch.float32), whole.chunk_tokens(torch.float32)) == (
        3,
        1e9 // bytes_per_token(vocab, 4),
    )
    ids = torch.randint(4, vocab, (1, 20))
    positions = torch.arange(19)
    weights = torch.linspace(-1, 1, 19)

    def scored(policy):
        model.zero_grad()
        logprobs, entropy = policy(ids, torch.arange(20)[None], positions, ids[0, 1:], temperature)
        (weights * logprobs).sum().backward()
        return logprobs.detach(), entropy, [p.grad.clone() for p in model.parameters()]

    (lp, h, grads), (lp_whole, h_whole, grads_whole) = scored(small), scored(whole)
    torch.testing.assert_close(lp, lp_whole)
    torch.testing.assert_close(h, h_whole)
    for g, g_whole in zip(grads, grads_whole):
        torch.testing.assert_close(g, g_whole)
