"""engine.replicas: several engines behind one `ReplicatedEngine`. Work splits by prompt group,
results come back in the caller's order and equal one engine's for the same requests, and every
weight sync reaches every replica. Real engines: the transformers engine in this process, and
(slow) vLLM replicas as Ray actors on a Ray started here."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import build_peaked_model, random_lora, reference_greedy, start_engine
from peft import get_peft_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.config import EngineConfig, PlacementConfig
from rlvr.engines.replicas import ReplicatedEngine, assign, spans, unplaceable
from rlvr.records import LoraAdapter, Request, Sampling
from rlvr.sync.check import logprob_gap

GREEDY = Sampling(temperature=0.0, max_tokens=10)


def test_spans_cut_contiguous_runs_of_near_equal_size():
    assert spans(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert spans(2, 4) == [(0, 1), (1, 2)]  # no empty runs
    assert spans(0, 2) == []
    assert spans(6, 1) == [(0, 6)]


def test_requests_go_whole_to_the_replica_with_the_fewest_samples_pending():
    loads = [0, 0]
    assert assign(loads, [4, 4, 4]) == [0, 1, 0] and loads == [8, 4]
    assert assign(loads, [1, 1, 1, 1, 1]) == [1, 1, 1, 1, 0] and loads == [9, 8]


def test_vllm_replicas_in_the_controller_process_are_refused_in_one_line(model_dir):
    local = EngineConfig(replicas=2)
    assert unplaceable(local, on_ray=False) == (
        "engine.replicas=2: vLLM replicas run as Ray actors (placement.backend: ray); "
        "on placement.backend: local only engine.backend: hf runs several engines"
    )
    assert unplaceable(local, on_ray=True) is None
    assert unplaceable(EngineConfig(backend="hf", replicas=2), on_ray=False) is None
    assert unplaceable(EngineConfig(), on_ray=False) is None
    with pytest.raises(ValueError, match=r"^engine.replicas=2: vLLM replicas run as Ray actors"):
        start_engine("vllm", model_dir, replicas=2)  # refused before anything starts
    assert PlacementConfig().backend == "local"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_peaked_model(tmp_path_factory.mktemp("replicas") / "model")


@pytest.fixture(scope="module")
def prompts(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(text) for text in ("abc", "hello world", "12+7=", "xyz", "3*3=")]


def _hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _drain(engine, requests: list[Request]) -> dict:
    engine.submit(requests)
    finished = {}
    while engine.pending:
        for key, rollouts in engine.poll():
            assert key not in finished
            finished[key] = [r.completion_ids for r in rollouts]
    return finished


def test_hf_replicas_give_one_engines_rollouts_in_order_and_every_replica_gets_the_adapter(model_dir, prompts):
    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    with start_engine("hf", model_dir) as one, start_engine("hf", model_dir, replicas=2) as two:
        assert isinstance(two, ReplicatedEngine) and len(two.replicas) == 2 and two.name == "hf"
        assert [r.seed for r in two.replicas] == [0, 1]  # each its own seed, derived from the run's
        expected = one.generate(prompts, 2, GREEDY)
        split = two.generate(prompts, 2, GREEDY)
        assert [r.prompt_index for r in split] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        assert [(r.prompt_ids, r.completion_ids) for r in split] == [(r.prompt_ids, r.completion_ids) for r in expected]
        # submit/poll: each request whole on one replica, every key answered once, as one engine answers it
        requests = [Request(("first", i), p, 1 + i % 2, GREEDY) for i, p in enumerate(prompts)]
        assert _drain(two, requests) == _drain(one, requests)
        assert two.pending == 0 and all(r.pending == 0 for r in two.replicas)
        sequences = [r.prompt_ids + r.completion_ids for r in expected]
        lens = [len(r.prompt_ids) for r in expected]
        scored, expected_scores = two.score(sequences, lens), one.score(sequences, lens)
        assert [len(s) for s in scored] == [len(s) for s in expected_scores]
        assert logprob_gap(scored, expected_scores) <= 1e-5

        peft_model, config = random_lora(_hf_model(model_dir), seed=3)
        two.update_lora(LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), 3))
        assert two.policy_version == 3 and [r.policy_version for r in two.replicas] == [3, 3]  # what a push check reads
        adapted = [reference_greedy(peft_model, p, GREEDY.max_tokens, eos) for p in prompts]
        assert adapted != [r.completion_ids for r in expected[::2]]  # the adapter changes the greedy rollouts
        for replica in two.replicas:  # each replica alone serves the adapter
            assert [r.completion_ids for r in replica.generate(prompts, 1, GREEDY)] == adapted
        # the sync probe's scoring: every replica scores every sequence under its own weights
        each = two.score_each(sequences, lens)
        assert len(each) == 2 and logprob_gap(each[0], each[1]) <= 1e-5 and logprob_gap(each[0], expected_scores) > 1e-3
        one.update_lora(LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), 0))
        assert one.score_each(sequences, lens) == [one.score(sequences, lens)]
        assert logprob_gap(each[1], one.score(sequences, lens)) <= 1e-5
    with pytest.raises(RuntimeError, match="closed"):
        two.generate(prompts, 1, GREEDY)
    with pytest.raises(RuntimeError, match="HF engine is closed"):
        two.replicas[1].generate(prompts, 1, GREEDY)


@pytest.mark.slow
def test_vllm_replicas_as_ray_actors_sample_as_one_engine_and_each_serves_the_adapter(model_dir, prompts):
    """Two vLLM engines, each in its own actor on a (CPU-only) Ray started here, as a run with
    placement.backend: ray places them: greedy rollouts split over both equal one engine's, in
    the caller's order, and an adapter pushed once reaches both."""
    from rlvr.orchestration.ray_placement import RayCluster, RayEngine

    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    cluster = RayCluster(PlacementConfig(backend="ray", colocate=False), ranks=0, engines=2)
    with start_engine(
        "vllm", model_dir, replicas=2, lora_rank=8, max_model_len=64, kv_cache_gb=0.25, placement=cluster
    ) as two:
        assert isinstance(two, ReplicatedEngine) and all(isinstance(r, RayEngine) for r in two.replicas)
        expected = two.replicas[0].generate(prompts, 1, GREEDY)  # one engine, every prompt (vLLM: greedy is n=1)
        split = two.generate(prompts, 1, GREEDY)
        assert [r.prompt_index for r in split] == [0, 1, 2, 3, 4]
        assert [r.completion_ids for r in split] == [r.completion_ids for r in expected]
        requests = [Request(i, p, 1, GREEDY) for i, p in enumerate(prompts)]
        assert _drain(two, requests) == {i: [r.completion_ids] for i, r in enumerate(expected)}

        peft_model, config = random_lora(_hf_model(model_dir), seed=3, rank=8)
        two.update_lora(LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), 3))
        assert two.policy_version == 3 and [r.policy_version for r in two.replicas] == [3, 3]  # what a push check reads
        adapted = [reference_greedy(peft_model, p, GREEDY.max_tokens, eos) for p in prompts]
        assert adapted != [r.completion_ids for r in expected]
        for replica in two.replicas:
            assert [r.completion_ids for r in replica.generate(prompts, 1, GREEDY)] == adapted
