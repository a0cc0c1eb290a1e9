"""Routing replay (R3) building blocks on tiny MoE models: recording the routers' choices,
replaying them (same weights: identical logprobs; other weights: the recorded experts are
the ones computed, with the trainer's own gate weights), the agreement and load metrics, and
laying per-sequence routes onto a packed trainer row."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlvr.models.moe import moe_layers
from rlvr.models.routing import (
    agreement_counts,
    expert_counts,
    expert_load_max_over_mean,
    record_routing,
    replay_routing,
    routing_agreement,
    row_routes,
)
from rlvr.models.tiny import build_tiny_model
from rlvr.quant import load_quantized_model, quantize_checkpoint
from rlvr.quant.experts import packed_experts_names
from rlvr.training.packing import plan
from rlvr.training.policy import apply_lora

ARCHS = ["deepseek_v3", "qwen3_moe", "mixtral"]
SIZES = dict(hidden_size=64, num_heads=4, num_kv_heads=4, num_layers=3, intermediate_size=128)


@pytest.fixture(scope="module", params=ARCHS)
def model_dir(request, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp(request.param), request.param, **SIZES)


def _load(model_dir, perturb_routers: float = 0.0):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if perturb_routers:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for layer in moe_layers(model):
                layer.router.weight.add_(torch.randn(layer.router.weight.shape, generator=generator) * perturb_routers)
    return model


def _experts_inputs(model):
    """Capture what each experts module is called with: (top_k_index, top_k_weights) per layer."""
    seen = []
    handles = [
        layer.experts.register_forward_pre_hook(lambda _m, args: seen.append((args[1], args[2])))
        for layer in moe_layers(model)
    ]
    return seen, handles


IDS = torch.randint(4, 250, (2, 10), generator=torch.Generator().manual_seed(0))


def test_recording_gives_each_tokens_choice_per_moe_layer_and_replay_on_the_same_weights_changes_nothing(model_dir):
    model = _load(model_dir)
    layers = moe_layers(model)
    seen, handles = _experts_inputs(model)
    with torch.no_grad(), record_routing(model) as record:
        logits = model(IDS).logits
    for handle in handles:
        handle.remove()
    routes = record.stacked()
    assert routes.shape == (IDS.numel(), len(layers), layers[0].top_k)
    assert all(torch.equal(routes[:, i], index) for i, (index, _) in enumerate(seen))  # what the experts got
    assert record.per_sequence(batch_size=2).shape == (2, IDS.shape[1], len(layers), layers[0].top_k)
    assert torch.equal(record.per_sequence(batch_size=2).flatten(0, 1), routes)

    with torch.no_grad(), replay_routing(model, routes) as own:
        replayed = model(IDS).logits
    assert torch.equal(replayed, logits)
    assert routing_agreement(own.stacked(), routes) == 1.0


def test_replay_on_other_weights_forces_the_recorded_experts_with_the_trainers_gate_weights(model_dir):
    routes_model = _load(model_dir)
    with torch.no_grad(), record_routing(routes_model) as record:
        routes_model(IDS)
    routes = record.stacked()

    trainer = _load(model_dir, perturb_routers=1.0)
    with torch.no_grad(), record_routing(trainer) as own_record:
        free = trainer(IDS).logits
    agreement = routing_agreement(own_record.stacked(), routes)
    assert agreement < 1.0  # the perturbed routers disagree on some tokens

    seen, handles = _experts_inputs(trainer)
    with torch.no_grad(), replay_routing(trainer, routes) as own:
        replayed = trainer(IDS).logits
    for handle in handles:
        handle.remove()
    assert routing_agreement(own.stacked(), routes) == agreement  # the trainer's own choice, still measured
    assert not torch.allclose(replayed, free)
    for i, (layer, (index, weights)) in enumerate(zip(moe_layers(trainer), seen)):
        assert torch.equal(index, routes[:, i])
        # gate weights: the trainer's router scores of the replayed experts, then its own normalisation
        hidden = torch.randn(3, layer.router.weight.shape[1])
        with replay_routing_single(trainer, layer, routes[:3, i]):
            _, replay_weights, replay_index = layer.router(hidden)
        assert torch.equal(replay_index, routes[:3, i])
        assert torch.allclose(replay_weights, _expected_gate_weights(layer, hidden, routes[:3, i]))
        assert weights.shape == index.shape


def replay_routing_single(model, layer, index):
    """Replay `index` in one router only (the others get no recorded choice, -1)."""
    layers = moe_layers(model)
    routes = torch.full((index.shape[0], len(layers), index.shape[1]), -1)
    routes[:, [m.router_name for m in layers].index(layer.router_name)] = index
    return replay_routing(model, routes)


def _expected_gate_weights(layer, hidden, index):
    """The router's weights for given experts, by each architecture's published formula."""
    logits = hidden @ layer.router.weight.T
    if hasattr(layer.router, "e_score_correction_bias"):  # DeepSeek-V3: sigmoid, no bias in the weights
        weights = logits.sigmoid().gather(1, index)
        return weights / (weights.sum(-1, keepdim=True) + 1e-20) * layer.router.routed_scaling_factor
    weights = logits.softmax(-1).gather(1, index)  # Mixtral, Qwen3-MoE (norm_topk_prob)
    normalise = getattr(layer.router, "norm_topk_prob", True)
    return weights / weights.sum(-1, keepdim=True) if normalise else weights


def test_record_and_replay_through_lora_wrappers_on_a_packed_base(model_dir, tmp_path):
    model = apply_lora(
        load_quantized_model(quantize_checkpoint(model_dir, tmp_path)), 4, 8.0, 0.0, "all-linear", target_experts=True
    )
    assert [layer.experts_name for layer in moe_layers(model)] == packed_experts_names(model)
    with torch.no_grad(), record_routing(model) as record:
        logits = model(IDS).logits
    with torch.no_grad(), replay_routing(model, record.stacked()):
        assert torch.equal(model(IDS).logits, logits)


def test_recomputed_forwards_replay_the_same_routes(model_dir):
    """With activation checkpointing the backward reruns each layer's forward: under replay it
    routes as the first forward did, so the gradients are those without checkpointing."""
    layers = moe_layers(_load(model_dir))
    scores = torch.rand(IDS.numel(), len(layers), layers[0].num_experts, generator=torch.Generator().manual_seed(2))
    routes = scores.argsort(dim=-1)[..., : layers[0].top_k]  # k distinct random experts per token and layer
    grads = []
    for checkpointing in (False, True):
        model = _load(model_dir, perturb_routers=1.0).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with replay_routing(model, routes) as own:
            model(IDS, labels=IDS).loss.backward()
        assert own.stacked().shape == routes.shape
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_negative_routes_leave_those_tokens_to_the_trainers_router(model_dir):
    model = _load(model_dir)
    with torch.no_grad(), record_routing(model) as record:
        logits = model(IDS).logits
    routes = record.stacked().clone()
    routes[: IDS.shape[1]] = -1  # the first sequence has no recorded routes
    with torch.no_grad(), replay_routing(model, routes) as own:
        assert torch.equal(model(IDS).logits, logits)
    recorded_pairs = IDS.shape[1] * len(moe_layers(model))  # the second sequence's tokens, every MoE layer
    assert agreement_counts(own.stacked(), routes) == (recorded_pairs, recorded_pairs)


def test_routes_of_the_wrong_length_are_refused(model_dir):
    model = _load(model_dir)
    layers = moe_layers(model)
    with pytest.raises(ValueError, match=r"routes give \(7, 2\) choices, the forward routes \(20, 2\)"):
        with replay_routing(model, torch.zeros(7, len(layers), 2, dtype=torch.long)):
            model(IDS)
    with pytest.raises(ValueError, match=rf"routes must be \[tokens, {len(layers)} MoE layers, k\]"):
        with replay_routing(model, torch.zeros(20, len(layers) + 1, 2, dtype=torch.long)):
            pass


def test_expert_load_max_over_mean():
    choices = torch.tensor(
        [[[0, 1], [0, 1]], [[0, 2], [2, 3]], [[0, 3], [1, 0]], [[0, 1], [3, 2]]]
    )  # [4 tokens, 2 layers, 2]
    # layer 0: counts 4, 2, 1, 1 (mean 2) -> 2.0; layer 1: 2, 2, 2, 2 -> 1.0
    assert expert_load_max_over_mean(expert_counts(choices, num_experts=4)).tolist() == [2.0, 1.0]
    assert expert_counts(torch.tensor([[[0, -1]]]), num_experts=2).tolist() == [[1.0, 0.0]]  # -1: no choice
    assert routing_agreement(choices, choices.flip(-1)) == 1.0  # a set, not an order
    assert agreement_counts(choices, torch.roll(choices, 1, dims=0)) == (1, 8)  # token 0, layer 0 only


def test_row_routes_follow_packed_rows_with_shared_prompts():
    prompt = [7, 8, 9]
    sequences = [prompt + [2, 3], [5, 6, 4], prompt + [1, 2, 3], prompt + [6]]
    prompt_lens = [3, 2, 3, 3]
    # each sequence's routes [positions, 2 layers, top-2] hold 100 * sequence + position
    routes = {
        i: torch.tensor([[[100 * i + p, 1], [100 * i + p, 2]] for p in range(len(s))]) for i, s in enumerate(sequences)
    }
    routes[3] = routes[3][:-1]  # a sampler returns no routes for the last token (never fed back)
    for share in (True, False):
        (micro_batch,) = plan(sequences, prompt_lens, world_size=1, token_budget=64, share_prompts=share)[0]
        row = row_routes(micro_batch, routes)
        assert row.shape == (micro_batch.num_tokens, 2, 2)
        tokens, positions = micro_batch.input_ids[0].tolist(), micro_batch.position_ids[0].tolist()
        unrecorded = [(tokens[t], positions[t]) for t in range(len(tokens)) if row[t, 0, 0] < 0]
        assert unrecorded == [(6, 3)] and (row[row[:, 0, 0] < 0] == -1).all()
        for t in range(len(tokens)):
            if row[t, 0, 0] >= 0:
                sequence, position = divmod(int(row[t, 0, 0]), 100)
                assert position == positions[t] and sequences[sequence][position] == tokens[t]
                assert row[t, 1].tolist() == [100 * sequence + position, 2]
        # every completion token reads the routes of its own sequence (the last is never fed back)
        for i, (start, count) in zip(micro_batch.sequences, micro_batch.spans):
            at = micro_batch.score_positions[start + 1 : start + count]  # rows of its tokens (but the last)
            assert all(int(row[a, 0, 0]) // 100 == i for a in at.tolist())
    # a rank with nothing to do runs an empty micro-batch: nothing to replay
    lone = plan(sequences[:1], prompt_lens[:1], world_size=2, token_budget=64)
    assert [row_routes(mb, routes) is None for rank in lone for mb in rank] == [False, True]
