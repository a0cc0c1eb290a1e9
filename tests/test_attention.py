"""Packed attention (each sequence of a packed row attends alone) against transformers' own
sdpa path with its block-diagonal mask: same logprobs and gradients, on tiny random models
that exercise grouped-query heads, a sliding window and Gemma-2's score softcapping."""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlvr.models.tiny import tiny_config
from rlvr.training.attention import NAME, PackedLayout, use_packed_attention
from rlvr.training.packing import plan
from rlvr.training.policy import TokenLogprobs


def test_layout_places_each_sequence_in_its_own_padded_row():
    layout = PackedLayout.from_positions(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    assert (layout.num_sequences, layout.longest) == (3, 3)
    assert layout.slot.tolist() == [0, 1, 2, 3, 4, 6]
    with pytest.raises(ValueError, match="must start at 0"):
        PackedLayout.from_positions(torch.tensor([[1, 2, 0]]))


def _configs():
    yield "qwen2", tiny_config("qwen2", vocab_size=64, hidden_size=64, num_layers=2, intermediate_size=128)
    mistral = tiny_config("mistral", vocab_size=64, hidden_size=64, num_layers=2, intermediate_size=128)
    mistral.sliding_window = 5  # shorter than most sequences below, so the window bites
    yield "mistral-window", mistral
    yield "gemma2-softcap", AutoConfig.for_model(
        "gemma2", vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, sliding_window=5, dtype="float32",
        attn_logit_softcapping=0.05,  # small enough to squash the scores of a random model
    )


@pytest.mark.parametrize("name,config", list(_configs()), ids=lambda x: x if isinstance(x, str) else "")
def test_packed_attention_equals_the_block_diagonal_mask(name, config):
    torch.manual_seed(0)
    sdpa = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa" if "softcap" not in name else "eager")
    packed = copy.deepcopy(sdpa)
    assert use_packed_attention(packed) and packed.config._attn_implementation == NAME
    sequences = [torch.randint(3, 60, (n,)).tolist() for n in (11, 25, 7, 19, 30)]
    (micro_batch,) = plan(sequences, [3] * len(sequences), 1, 200)[0]

    def logprobs_and_grads(model):
        logprobs, _ = TokenLogprobs(model)(micro_batch.input_ids, micro_batch.position_ids, micro_batch.targets)
        (logprobs * torch.linspace(-1, 1, logprobs.numel())).sum().backward()
        return logprobs.detach(), [p.grad for p in model.parameters()]

    expected_lp, expected_grads = logprobs_and_grads(sdpa)
    lp, grads = logprobs_and_grads(packed)
    assert torch.allclose(lp, expected_lp, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, atol=1e-5)


def test_a_row_without_layout_is_one_causal_sequence():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=64, hidden_size=64, num_layers=1,
                                                         intermediate_size=128), attn_implementation="sdpa")
    ids = torch.randint(3, 60, (1, 12))
    expected = model(ids).logits
    use_packed_attention(model)
    assert torch.allclose(model(ids).logits, expected, atol=1e-5)
