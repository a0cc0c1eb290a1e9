"""trainer.backend=megatron behind the same Trainer as FSDP2: on one tiny dense model, FSDP2 over
two ranks and Megatron (tensor parallel 2; and two data-parallel replicas) give equal sequence
logprobs, for the base and with the adapter a train step made, the same step metrics, and the
same adapter in PEFT's names and config; a saved Megatron rank resumes where it stopped. On a tiny
DeepSeek-V3, Megatron's expert parallel 2 does the same as FSDP2, routing replayed and the routed
experts adapted too."""

from __future__ import annotations

import pytest
import torch
from _floats import assert_close_scaled
from engine_fixtures import random_train_batch, rank_spec
from megatron_fixtures import dense_folder, moe_folder

from rlvr.training.trainer import Trainer, TrainerError

LORA = dict(rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")
LAYOUTS = {"fsdp2": {}, "megatron tp2": {"tensor_parallel": 2}, "megatron dp2": {"tensor_parallel": 1}}


@pytest.mark.slow
def test_megatron_trains_like_fsdp2(tmp_path):
    model = dense_folder(tmp_path / "qwen2", "qwen2")
    batch = random_train_batch()
    sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    prompt_lens = [len(p) for p in batch.prompt_ids]
    results = {}
    for name, megatron in LAYOUTS.items():
        backend = dict(backend="megatron", megatron=megatron) if megatron else {}
        spec = rank_spec(model, lr=1e-2, lora=LORA, ranks=2, micro_batch_tokens=14, total_steps=2, **backend)
        with Trainer(spec) as trainer:
            base = trainer.logprobs(sequences, prompt_lens)
            metrics = trainer.train_step(batch)
            adapter = trainer.adapter()
            trained = trainer.logprobs(sequences, prompt_lens)
            if name == "megatron tp2":
                trainer.save(str(tmp_path))
                after = trainer.train_step(batch)
        results[name] = base, metrics, adapter, trained
    want_base, want_metrics, want_adapter, want_trained = results["fsdp2"]
    assert want_adapter.tensors and want_metrics["grad_norm"] > 0
    for name in LAYOUTS:
        base, metrics, adapter, trained = results[name]
        assert_close_scaled(sum(base, []), sum(want_base, []), msg=f"{name} base")
        assert_close_scaled(sum(trained, []), sum(want_trained, []), msg=f"{name} trained")
        for key in ("loss", "grad_norm", "policy/entropy", "sync/sampler_trainer_gap"):
            assert metrics[key] == pytest.approx(want_metrics[key], rel=1e-5, abs=1e-7), (name, key)
        assert adapter.config == want_adapter.config, name
        assert adapter.tensors.keys() == want_adapter.tensors.keys(), name
        for tensor, value in want_adapter.tensors.items():  # as tests/test_trainer.py compares FSDP2's layouts:
            # Adam's first step is lr * g / (|g| + eps): an entry whose gradient is near eps moves by
            # a fraction of lr that the gradient's rounding sets
            torch.testing.assert_close(adapter.tensors[tensor], value, atol=1e-5, rtol=1e-5, msg=f"{name} {tensor}")
    spec = rank_spec(model, lr=1e-2, lora=LORA, ranks=2, micro_batch_tokens=14, total_steps=2, backend="megatron")
    spec.trainer.megatron.tensor_parallel = 2
    with Trainer(spec) as resumed:
        resumed.load(str(tmp_path))
        assert_close_scaled(sum(resumed.logprobs(sequences, prompt_lens), []), sum(results["megatron tp2"][3], []))
        again = resumed.train_step(batch)
    for key in ("loss", "grad_norm", "lr"):
        assert again[key] == pytest.approx(after[key], rel=1e-6), key


@pytest.mark.slow
def test_megatron_expert_parallel_trains_a_deepseek_v3_like_fsdp2(tmp_path):
    """The engine's routes (random here, so that replay visibly differs from the trainer's own
    choices) are replayed by both backends' routers; the adapter covers every MLA projection, the
    dense MLP, the shared experts and each routed expert (`lora.target_experts`: each
    expert-parallel rank trains its own experts' pairs, gathered back into PEFT's layout)."""
    model = moe_folder(tmp_path / "deepseek_v3")
    batch = random_train_batch()
    sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    prompt_lens = [len(p) for p in batch.prompt_ids]
    g = torch.Generator().manual_seed(5)
    batch.routes = [  # [positions fed, 2 MoE layers, top 2]: two distinct experts of 8 each
        torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(2 * (len(s) - 1))]).view(-1, 2, 2).byte()
        for s in sequences
    ]
    results = {}
    for name, backend in {
        "fsdp2": {},
        "megatron ep2": dict(backend="megatron", megatron={"expert_parallel": 2}),
    }.items():
        lora = LORA | {"target_experts": True}
        spec = rank_spec(
            model, lr=1e-2, lora=lora, ranks=2, micro_batch_tokens=14, total_steps=2, routing_replay=True, **backend
        )
        with Trainer(spec) as trainer:
            base = trainer.logprobs(sequences, prompt_lens)
            metrics = trainer.train_step(batch)
            adapter = trainer.adapter()
            trained = trainer.logprobs(sequences, prompt_lens)
        results[name] = base, metrics, adapter, trained
    (want_base, want_metrics, want_adapter, want_trained), (base, metrics, adapter, trained) = results.values()
    assert any(".shared_experts." in t for t in want_adapter.tensors) and any(
        ".q_a_proj." in t for t in adapter.tensors
    )
    assert {t for t in want_adapter.tensors if ".mlp.experts." in t} == {
        f"base_model.model.model.layers.{layer}.mlp.experts.{nest}lora_{factor}.weight"
        for layer in (1, 2) for nest in ("", "base_layer.") for factor in "AB"
    }  # fmt: skip
    assert metrics["moe/routing_agreement"] < 0.5  # the routes are not the routers' own
    assert_close_scaled(sum(base, []), sum(want_base, []), msg="base")
    assert_close_scaled(sum(trained, []), sum(want_trained, []), msg="trained")
    for key in ("loss", "grad_norm", "policy/entropy", "sync/sampler_trainer_gap", "moe/routing_agreement",
                "moe/sampler_trainer_gap_no_replay", "moe/expert_load_max_over_mean"):  # fmt: skip
        assert metrics[key] == pytest.approx(want_metrics[key], rel=1e-5, abs=1e-7), key
    assert adapter.config == want_adapter.config
    assert adapter.tensors.keys() == want_adapter.tensors.keys()
    for tensor, value in want_adapter.tensors.items():
        torch.testing.assert_close(adapter.tensors[tensor], value, atol=1e-5, rtol=1e-5, msg=tensor)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "refusal"),
    [
        ({"ranks": 1, "gradient_checkpointing": True}, "does not recompute blocks yet"),
        ({"ranks": 2, "megatron": {"pipeline_parallel": 2}}, "pipeline_parallel=2: the Megatron rank does not build"),
        ({"ranks": 2, "megatron": {"tensor_parallel": 2, "sequence_parallel": True}}, "does not split tokens"),
    ],
    ids=["recompute", "pipeline", "sequence"],
)
def test_megatron_refuses_what_it_plans_but_does_not_build(tmp_path, layout, refusal):
    """Recompute, pipeline stages and sequence parallel are planned for a Megatron layout, but its
    rank builds none of them yet: the run stops at start, saying so, rather than training every
    block whole on every rank unasked."""
    model = dense_folder(tmp_path / "qwen2", "qwen2")
    trainer = Trainer(rank_spec(model, lora=LORA, backend="megatron", **layout))
    with pytest.raises(TrainerError, match=refusal) as error:
        trainer.wait_started()
    assert "\n" not in str(error.value)
    trainer.close()
