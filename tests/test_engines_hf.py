"""The transformers engine: same interface and logprob convention as vLLM, fast to run."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import (
    assert_stop_token_cuts_the_same_draws,
    assert_top_k_one_is_greedy,
    build_peaked_model,
    random_lora,
    rank_spec,
    reference_greedy,
    reference_logprobs,
    start_engine,
)
from peft import get_peft_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.engines.base import EngineDied
from rlvr.records import LoraAdapter, Sampling
from rlvr.sync.check import SyncCheck, logprob_gap, probe_inputs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_peaked_model(tmp_path_factory.mktemp("hf-engine") / "model")


@pytest.fixture
def engine(model_dir):
    # the vLLM options of EngineConfig mean nothing to it, so one config drives both backends
    with start_engine("hf", model_dir, hf_batch_size=4, kv_cache_gb=1) as e:
        yield e


@pytest.fixture(scope="module")
def prompts(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(text) for text in ("abc", "hello world", "12+7=")]


def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_rollouts_ordered_and_sized(engine, prompts):
    rollouts = engine.generate(prompts, 3, Sampling(temperature=1.0, max_tokens=6, seed=0))
    assert [r.prompt_index for r in rollouts] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for r in rollouts:
        assert len(r.completion_ids) == len(r.logprobs) <= 6
        assert r.finish_reason == ("length" if len(r.completion_ids) == 6 else "stop")


def test_seed_reproduces(engine, prompts):
    sampling = Sampling(temperature=1.0, max_tokens=8, seed=5)
    assert [r.completion_ids for r in engine.generate(prompts, 2, sampling)] == [
        r.completion_ids for r in engine.generate(prompts, 2, sampling)
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_a_forward_pass(engine, prompts, model_dir, temperature):
    rollouts = engine.generate(prompts, 2, Sampling(temperature=temperature, max_tokens=10, seed=1))
    sequences = [r.prompt_ids + r.completion_ids for r in rollouts]
    lens = [len(r.prompt_ids) for r in rollouts]
    assert (
        logprob_gap(
            [r.logprobs for r in rollouts], reference_logprobs(hf_model(model_dir), sequences, lens, temperature)
        )
        <= 1e-3
    )
    assert logprob_gap(engine.score(sequences, lens), reference_logprobs(hf_model(model_dir), sequences, lens)) <= 1e-4


def test_per_prompt_max_tokens(engine, prompts):
    samplings = [Sampling(temperature=1.0, max_tokens=m, seed=2) for m in (2, 5, 9)]
    rollouts = engine.generate(prompts, 1, samplings, ignore_eos=True)
    assert [len(r.completion_ids) for r in rollouts] == [2, 5, 9]


def test_stop_string_kept_in_text(engine, prompts):
    sampled = engine.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=20, seed=3))
    stop = next(r.text[2] for r in sampled if len(r.text) > 2)
    stopped = [
        r
        for r in engine.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=20, seed=3, stop=(stop,)))
        if stop in r.text
    ]
    assert stopped and all(r.text.endswith(stop) and r.finish_reason == "stop" for r in stopped)


def test_stop_token_ends_the_completion_and_stays_in_it(engine, prompts):
    assert_stop_token_cuts_the_same_draws(engine, prompts)


def test_top_k_one_samples_the_greedy_completion(engine, prompts):
    assert_top_k_one_is_greedy(engine, prompts)


def test_update_lora_matches_peft_and_sync_check_catches_a_stale_engine(engine, prompts, model_dir):
    peft_model, config = random_lora(hf_model(model_dir), seed=21)
    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    engine.update_lora(LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), 0))
    greedy = [r.completion_ids for r in engine.generate(prompts, 1, Sampling(temperature=0.0, max_tokens=12))]
    assert greedy == [reference_greedy(peft_model, p, 12, eos) for p in prompts]
    probe = list(zip(prompts, greedy))
    check = SyncCheck(0.05)
    sequences, prompt_lens = probe_inputs(probe)
    engine_lp = engine.score(sequences, prompt_lens)
    assert check(logprob_gap(engine_lp, reference_logprobs(peft_model, sequences, prompt_lens)), step=1) <= 1e-4
    with pytest.raises(
        RuntimeError, match=r"sync/logprob_gap=.* > 0.05 after the sync of step 2: the engine did not receive"
    ):
        check(logprob_gap(engine_lp, reference_logprobs(hf_model(model_dir), sequences, prompt_lens)), step=2)


def test_weight_sync_probes_the_pushes_no_trained_gap_checks_and_holds_trained_gaps_to_the_threshold(
    engine, prompts, model_dir
):
    from rlvr.sync.weights import WeightSync
    from rlvr.tracking.timing import StepTimer
    from rlvr.training.trainer import Trainer

    probe = [(p, p[:4]) for p in prompts]
    with Trainer(rank_spec(model_dir, lora=dict(rank=4, alpha=8.0, target_modules="all-linear"))) as trainer:
        # default: the first push to the engine, then only pushes used before a step's gap checks them
        sync = WeightSync(engine, trainer, probe, SyncCheck(0.05), StepTimer(), lora=True)
        pushed = [sync.push(step, None if step == 0 else 1e-6, used_unchecked=step == 3) for step in range(5)]
        assert [bool(m) for m in pushed] == [True, False, False, True, False]
        assert all(m["sync/logprob_gap"] <= 1e-4 for m in pushed if m)
        # every push sent the adapter, versioned by its step: the engine serves the last one
        assert sync.serving is not None and sync.serving.version == 4 and engine.policy_version == 4
        # check_every N: also every Nth step; a resumed run's first push is probed, whatever its step
        periodic = WeightSync(engine, trainer, probe, SyncCheck(0.05), StepTimer(), True, check_every=3)
        assert [bool(periodic.push(step, 1e-6, used_unchecked=False)) for step in (7, 8, 9, 10)] == [
            True,
            False,
            True,
            False,
        ]
        sync.push(
            5, trained_gap=float("nan")
        )  # the trainer's own non-finite logprobs: a skipped step, not a stale engine
        with pytest.raises(RuntimeError, match=r"sync/sampler_trainer_gap=0.2 > 0.05 after the sync of step 5"):
            sync.push(6, trained_gap=0.2)


class _DiesUnderItsNextPush:
    """The HF engine, except that its next adapter push finds its process dead (as vLLM's engine core raises)."""

    def __init__(self, engine):
        self._engine, self.dead = engine, False

    def update_lora(self, adapter):
        if self.dead:
            raise EngineDied("the engine core process died")
        self._engine.update_lora(adapter)

    def close(self):  # the fixture's engine outlives each wrapper the supervisor builds and closes
        pass

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_an_engine_rebuilt_under_a_push_gets_that_push_probed(engine, prompts, model_dir):
    # CI killed the engine core while the ranks trained: the push found it dead, and the supervisor
    # rebuilt it and pushed again; counted before the push, that new engine went unprobed
    from rlvr.orchestration.engine_supervisor import EngineSupervisor
    from rlvr.sync.weights import WeightSync
    from rlvr.tracking.timing import StepTimer
    from rlvr.training.trainer import Trainer

    built = []
    supervisor = EngineSupervisor(
        lambda: built.append(_DiesUnderItsNextPush(engine)) or built[-1], 1, log=lambda _: None
    )
    probe = [(p, p[:4]) for p in prompts]
    with Trainer(rank_spec(model_dir, lora=dict(rank=4, alpha=8.0, target_modules="all-linear"))) as trainer:
        sync = WeightSync(supervisor, trainer, probe, SyncCheck(0.05), StepTimer(), lora=True)
        assert sync.push(0) and not sync.push(1, trained_gap=1e-6, used_unchecked=False)
        built[0].dead = True
        probed = sync.push(2, trained_gap=1e-6, used_unchecked=False)
        assert supervisor.restarts == 1 and len(built) == 2
        assert probed["sync/logprob_gap"] <= 1e-4 and engine.policy_version == 2
        assert not sync.push(3, trained_gap=1e-6, used_unchecked=False)  # probed once per engine


def test_update_weights(prompts, model_dir, tmp_path):
    other = hf_model(build_peaked_model(tmp_path / "other", seed=1))
    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    with start_engine("hf", model_dir) as engine:
        engine.update_weights(other.state_dict().items())
        assert engine.policy_version == 1  # one more than served, unless the push names its version
        engine.update_weights(other.state_dict().items(), version=5)
        assert engine.policy_version == 5
        greedy = [r.completion_ids for r in engine.generate(prompts, 1, Sampling(temperature=0.0, max_tokens=12))]
    assert greedy == [reference_greedy(other, p, 12, eos) for p in prompts]
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(prompts, 1, Sampling())


def test_unknown_backend_is_a_config_error_naming_the_key():
    from rlvr.config import ConfigError, validate_config

    with pytest.raises(ConfigError, match=r"engine.backend: Input should be 'vllm' or 'hf' \(got 'sglang'\)"):
        validate_config({"model": {"path": "m"}, "data": {"train": "t"}, "engine": {"backend": "sglang"}})
