"""Packed attention (each sequence of a packed row attends alone) against transformers' own
sdpa path with its block-diagonal mask: same logprobs and gradients, on tiny random models
that exercise grouped-query heads, a sliding window and Gemma-2's score softcapping."""

import copy

import pytest
import torch
from _floats import assert_close_scaled
from transformers import AutoConfig, AutoModelForCausalLM

from rlvr.config import TrainerConfig
from rlvr.models.tiny import tiny_config
from rlvr.training.attention import NAME, PackedLayout, Segment, use_packed_attention
from rlvr.training.packing import plan, unpack
from rlvr.training.policy import TokenLogprobs


def test_layout_places_each_sequence_in_its_own_padded_row():
    layout = PackedLayout.build([Segment(0, 3), Segment(3, 2), Segment(5, 1)])
    (batch,) = layout.batches
    assert (batch.num_sequences, batch.query_len, layout.key_len, batch.prefix_lens, batch.rows) == (
        3,
        3,
        3,
        None,
        None,
    )
    assert layout.query_slot.tolist() == [0, 1, 2, 3, 4, 6]
    assert layout.key_index.tolist() == [0, 1, 2, 3, 4, 0, 5, 0, 0]


def test_layout_gives_each_completion_the_shared_prompt_as_its_first_keys():
    # a 3-token prompt at 0..2, completions at 3..4 and 5..7
    layout = PackedLayout.build(
        [Segment(0, 3), Segment(3, 2, prefix_start=0, prefix_len=3), Segment(5, 3, prefix_start=0, prefix_len=3)]
    )
    (batch,) = layout.batches
    assert (batch.query_len, layout.key_len, batch.prefix_lens.tolist()) == (3, 6, [0, 3, 3])
    assert layout.query_slot.tolist() == [0, 1, 2, 3, 4, 6, 7, 8]
    assert layout.key_index.tolist() == [0, 1, 2, 0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 1, 2, 5, 6, 7]


def test_uneven_lengths_split_into_query_batches_where_that_scores_fewer_pairs():
    # one 400-token sequence among eight of 20: one padded batch would score 9 x 400 x 400 pairs
    lengths = [20, 20, 400, 20, 20, 20, 20, 20, 20]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    layout = PackedLayout.build([Segment(s, n) for s, n in zip(starts, lengths)])
    assert [(b.num_sequences, b.query_len, b.rows.tolist()) for b in layout.batches] == [
        (8, 20, [0, 1, 3, 4, 5, 6, 7, 8]),
        (1, 400, [2]),
    ]
    assert layout.key_len == 400 and layout.pairs == (8 * 20 + 400) * 400
    # each token's query slot: the short ones first (batch order), the long one after their 160 slots
    assert layout.query_slot[:20].tolist() == list(range(20))
    assert layout.query_slot[40:440].tolist() == list(range(160, 560))
    # similar lengths stay one batch: a second call would save fewer pairs than it costs
    lengths = [30 - i for i in range(8)]
    even = PackedLayout.build([Segment(sum(lengths[:i]), n) for i, n in enumerate(lengths)])
    assert len(even.batches) == 1


def _configs():
    yield "qwen2", tiny_config("qwen2", vocab_size=64, hidden_size=64, num_layers=2, intermediate_size=128)
    mistral = tiny_config("mistral", vocab_size=64, hidden_size=64, num_layers=2, intermediate_size=128)
    mistral.sliding_window = 5  # shorter than most sequences below, so the window bites
    yield "mistral-window", mistral
    yield (
        "gemma2-softcap",
        AutoConfig.for_model(
            "gemma2",
            vocab_size=64,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            sliding_window=5,
            dtype="float32",
            attn_logit_softcapping=0.05,  # small enough to squash the scores of a random model
        ),
    )


def _logprobs_and_grads(model, micro_batch):
    """Per-sequence logprobs of one packed micro-batch, and the parameter gradients of a
    weighted sum of them (weights fixed per sequence and token, so packing order cannot hide)."""
    model.zero_grad()
    policy = TokenLogprobs(model, TrainerConfig().logits_chunk_mb)
    logprobs, _ = policy(
        micro_batch.input_ids,
        micro_batch.position_ids,
        micro_batch.score_positions,
        micro_batch.score_targets,
        layout=micro_batch.layout,
    )
    per_sequence = dict(zip(micro_batch.sequences, unpack(logprobs, micro_batch)))
    weights = {i: torch.linspace(-1, 1, len(lp)) * (i + 1) for i, lp in per_sequence.items()}
    sum((lp * weights[i]).sum() for i, lp in per_sequence.items()).backward()
    return {i: lp.detach() for i, lp in per_sequence.items()}, [p.grad.clone() for p in model.parameters()]


def _models(name, config):
    torch.manual_seed(0)
    sdpa = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa" if "softcap" not in name else "eager")
    packed = copy.deepcopy(sdpa)
    assert use_packed_attention(packed) and packed.config._attn_implementation == NAME
    return sdpa, packed


def _assert_same(got, want):
    (lp, grads), (expected_lp, expected_grads) = got, want
    assert lp.keys() == expected_lp.keys()
    # tolerances scale with each tensor's largest value (gradients reach 20-45 here): another CPU's
    # rounding is ~1e-6 of that, a wrong mask or position ~1e-2 or more
    for i in lp:
        assert_close_scaled(lp[i], expected_lp[i], msg=f"logprobs of sequence {i}")
    for k, (g, w) in enumerate(zip(grads, expected_grads, strict=True)):
        assert_close_scaled(g, w, msg=f"gradient of parameter {k}")


@pytest.mark.parametrize("name,config", list(_configs()), ids=lambda x: x if isinstance(x, str) else "")
def test_packed_attention_equals_the_block_diagonal_mask(name, config):
    sdpa, packed = _models(name, config)
    sequences = [torch.randint(3, 60, (n,)).tolist() for n in (11, 25, 7, 19, 30)]
    (micro_batch,) = plan(sequences, [3] * len(sequences), 1, 200)[0]
    _assert_same(_logprobs_and_grads(packed, micro_batch), _logprobs_and_grads(sdpa, micro_batch))


def _uneven_shared_batch(budget_overhead=None):
    """Long and short completions of two shared prompts in one micro-batch, and the same with a
    prompt copy per sample."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (n,), generator=g).tolist() for n in (6, 9)]
    owners = [0, 0, 0, 1, 1, 1]
    sequences = [
        prompts[o] + torch.randint(3, 60, (n,), generator=g).tolist() for o, n in zip(owners, (120, 12, 5, 8, 100, 3))
    ]
    prompt_lens = [len(prompts[o]) for o in owners]
    (shared,) = plan(sequences, prompt_lens, 1, 1024, share_prompts=True)[0]
    (copies,) = plan(sequences, prompt_lens, 1, 1024)[0]
    return shared, copies


@pytest.mark.parametrize("name,config", list(_configs()), ids=lambda x: x if isinstance(x, str) else "")
def test_uneven_lengths_in_several_query_batches_equal_the_block_diagonal_mask(name, config):
    """The row is attended in several padded batches (checked), with the logprobs and gradients
    of sdpa on a copy per sample."""
    sdpa, packed = _models(name, config)
    shared, copies = _uneven_shared_batch()
    assert len(shared.layout.batches) > 1
    _assert_same(_logprobs_and_grads(packed, shared), _logprobs_and_grads(sdpa, copies))


def test_splitting_a_row_into_query_batches_changes_no_bit(monkeypatch):
    """Logprobs and gradients of the split row are those of one padded batch, bit for bit."""
    import rlvr.training.attention as attention

    _, packed = _models(*next(_configs()))
    split, _ = _uneven_shared_batch()
    monkeypatch.setattr(attention, "CALL_OVERHEAD_PAIRS", float("inf"))
    whole, _ = _uneven_shared_batch()
    assert len(split.layout.batches) > 1 and len(whole.layout.batches) == 1
    (lp, grads), (whole_lp, whole_grads) = _logprobs_and_grads(packed, split), _logprobs_and_grads(packed, whole)
    assert all(torch.equal(lp[i], whole_lp[i]) for i in lp)
    assert all(torch.equal(g, w) for g, w in zip(grads, whole_grads))


@pytest.mark.parametrize("name,config", list(_configs()), ids=lambda x: x if isinstance(x, str) else "")
def test_a_shared_prompt_gives_what_a_copy_per_sample_gives(name, config):
    """Two prompts (6 and 4 tokens, longer than mistral's window of 5) with 3 and 2 samples, and
    a sequence alone: one prompt copy per group in the row, same logprobs and gradients as
    transformers' sdpa on a copy per sample."""
    sdpa, packed = _models(name, config)
    prompts = [torch.randint(3, 60, (n,)).tolist() for n in (6, 4, 5)]
    owners = [0, 1, 0, 2, 1, 0]
    sequences = [prompts[o] + torch.randint(3, 60, (n,)).tolist() for o, n in zip(owners, (4, 9, 1, 6, 3, 7))]
    prompt_lens = [len(prompts[o]) for o in owners]
    (shared,) = plan(sequences, prompt_lens, 1, 200, share_prompts=True)[0]
    (copies,) = plan(sequences, prompt_lens, 1, 200)[0]
    assert shared.num_tokens == copies.num_tokens - 2 * 6 - 1 * 4  # the repeated prompt copies are gone
    _assert_same(_logprobs_and_grads(packed, shared), _logprobs_and_grads(sdpa, copies))


def test_a_row_without_layout_is_one_causal_sequence():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_config("llama", vocab_size=64, hidden_size=64, num_layers=1, intermediate_size=128),
        attn_implementation="sdpa",
    )
    ids = torch.randint(3, 60, (1, 12))
    expected = model(ids).logits
    use_packed_attention(model)
    assert_close_scaled(model(ids).logits, expected)
