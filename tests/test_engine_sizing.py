"""The engine's max_model_len: sized from the model and the data by one rule (rollout.prompts.context_length)
that `rlvr train`, `rlvr eval` and the plan all apply; a prompt that cannot fit is one line naming its row."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.config import EnvConfig, load_config
from rlvr.models.multimodal import max_positions
from rlvr.models.tiny import build_char_tokenizer, build_tiny_model
from rlvr.orchestration.builders import sized_engine
from rlvr.planning.plan import PlanError, make_plan
from rlvr.planning.sections import PlanSections
from rlvr.rollout.prompts import context_length, load_prompt_set

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def sized(longest, max_tokens=64, env=None, max_model_len=None, positions=None):
    return context_length(
        longest,
        "data.jsonl: problem #3 (id x)",
        max_tokens=max_tokens,
        env=env,
        max_model_len=max_model_len,
        positions=positions,
        model="m",
    )


def test_the_rule():
    assert sized(100) == sized(100, positions=4096) == 164  # the longest prompt and its answer
    assert sized(100, positions=164) == 164
    assert sized(100, max_model_len=300, positions=4096) == 300  # an explicit length that fits wins
    # a multi-turn trajectory gets room for its later answers and the observations before them, within the model
    tools = EnvConfig(name="calculator", max_turns=3, max_observation_chars=100)
    assert sized(100, env=tools) == 100 + 64 + 2 * (64 + 100)
    assert sized(100, env=tools, positions=256) == 256
    assert sized(100, env=EnvConfig(max_turns=3)) == 164  # single_turn: one answer whatever max_turns says


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(positions=160),
            "data.jsonl: problem #3 (id x) has 100 prompt tokens: with rollout.sampling.max_tokens=64 "
            "that is 164, more than the model's max_position_embeddings=160 (m)",
        ),
        (dict(max_model_len=128), "that is 164, more than engine.max_model_len=128 (m)"),
        (
            dict(max_model_len=512, positions=256),
            "engine.max_model_len=512 exceeds the model's max_position_embeddings=256 (m)",
        ),
    ],
)
def test_what_cannot_fit_is_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        sized(100, **kwargs)
    assert "\n" not in str(caught.value)


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """A tiny model built for 256 positions."""
    return build_tiny_model(
        tmp_path_factory.mktemp("short") / "model",
        "qwen2",
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        max_position_embeddings=256,
    )


def _rows(path: Path, questions: list[str]) -> Path:
    path.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in questions))
    return path


def test_train_sizes_from_the_longest_prompt_of_both_sets_and_names_the_row(tmp_path, short_model):
    train = _rows(tmp_path / "train.jsonl", ["1+1", "2+2"])
    test = _rows(tmp_path / "test.jsonl", ["3+3", "x" * 80])
    cfg = load_config(
        CONFIGS / "demo.yaml",
        [
            f"model.path={short_model}",
            f"data.train={train}",
            f"data.test={test}",
            "engine.max_model_len=null",
            "rollout.sampling.max_tokens=40",
        ],
    )
    tokenizer = build_char_tokenizer()
    sets = [load_prompt_set(cfg.data, cfg.data.train, tokenizer), load_prompt_set(cfg.data, cfg.data.test, tokenizer)]
    longest = max(len(p) for s in sets for p in s.prompts)
    assert longest == len(sets[1].prompts[1])  # the test set's second row
    assert sized_engine(cfg, sets, max_positions(short_model)).engine.max_model_len == longest + 40
    long_answers = cfg.model_copy(
        update={
            "rollout": cfg.rollout.model_copy(
                update={"sampling": cfg.rollout.sampling.model_copy(update={"max_tokens": 256 - longest + 1})}
            )
        }
    )
    with pytest.raises(
        ValueError,
        match=rf"^{test}: problem #2 \(id test-2\) has {longest} prompt tokens: with "
        rf"rollout.sampling.max_tokens={256 - longest + 1} that is 257, more than the "
        rf"model's max_position_embeddings=256 \({short_model}\)$",
    ):
        sized_engine(long_answers, sets, max_positions(short_model))


def test_the_plan_applies_the_same_rule():
    """The plan has no data: a prompt as long as data.max_prompt_tokens allows is the one that must fit."""
    cfg = load_config(CONFIGS / "gsm8k_qwen2.5_0.5b_1gpu.yaml", ["engine.max_model_len=null"])
    make_plan(
        PlanSections.of(cfg)
    )  # sized: no length to refuse (model.path is not on this machine: no positions to cap at)
    with pytest.raises(
        PlanError,
        match=r"^a prompt of data.max_prompt_tokens=512 has 512 prompt tokens: with "
        r"rollout.sampling.max_tokens=1024 that is 1536, more than engine.max_model_len=1000",
    ):
        make_plan(PlanSections.of(load_config(CONFIGS / "gsm8k_qwen2.5_0.5b_1gpu.yaml", ["engine.max_model_len=1000"])))


def test_rlvr_eval_names_a_prompt_too_long_for_the_model_in_one_line(tmp_path, short_model):
    rows = _rows(tmp_path / "long.jsonl", ["1+1", "y" * 300])
    done = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "eval", str(short_model), "--dataset", str(rows)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {rows}: problem #2 (id long-2) has "), lines
