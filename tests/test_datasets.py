"""Built-in datasets, files, verl/SkyRL rows, datasets folders and reasoning-gym tasks; one-line errors."""

import json
import re

import pytest

from rlvr.config import ConfigError, load_config
from rlvr.data.datasets import BUILTIN, load_problems
from rlvr.data.rows import verifier_for_source
from rlvr.records import Problem, Score
from rlvr.rewards.verifiers import get_verifier

SIZES = {
    "aime2024": 30,
    "math500": 500,
    "gsm8k": 1319,
    "gsm8k_train": 7473,
    "math_train": 7470,
    "aime_1983_2023": 975,
    "deepmath5k": 4994,
}


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_sets_load_whole(name):
    problems = load_problems(name)
    assert len(problems) == SIZES[name]
    assert all(p.question and p.answer for p in problems)
    assert problems[0].meta["verifier"] in ("math", "aime", "gsm8k")


def test_builtin_answer_rules():
    gsm = load_problems("gsm8k")
    assert gsm[0].answer == "18" and all("####" not in p.answer and "," not in p.answer for p in gsm)
    aime = load_problems("aime2024")
    assert sum(p.answer.startswith("0") for p in aime) == 7  # "025" stays text; the aime verifier compares integers
    assert load_problems("math500", limit=3)[0].meta["subject"] == "Precalculus"


def test_file_formats_and_field_mapping(tmp_path):
    rows = [{"q": "1+1?", "a": 2}, {"q": "2+2?", "a": "4"}]
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "s.json").write_text(json.dumps(rows))
    for path in (tmp_path / "s.jsonl", tmp_path / "s.json"):
        problems = load_problems(str(path), problem_field="q", answer_field="a")
        assert [(p.question, p.answer, p.id) for p in problems] == [("1+1?", "2", "s-1"), ("2+2?", "4", "s-2")]
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist([{"problem": "x?", "answer": "1"}]), tmp_path / "s.parquet")
    assert load_problems(str(tmp_path / "s.parquet"))[0].answer == "1"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"problem": "x"}\n', "s.jsonl:1: missing answer field"),
        ('{"problem": "x", "answer": "1"}\n{bad\n', "s.jsonl:2: not valid JSON"),
        ('{"problem": "x", "answer": ""}\n', 's.jsonl:1: empty field "answer"'),
        ("[1]\n", "s.jsonl:1: expected a JSON object"),
    ],
)
def test_bad_rows_are_one_line_errors(tmp_path, content, message):
    (tmp_path / "s.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message):
        load_problems(str(tmp_path / "s.jsonl"))


def test_missing_named_field_and_unknown_dataset(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"problem": "x", "answer": "1"}\n')
    with pytest.raises(ValueError, match='s.jsonl:1: missing field "solution"'):
        load_problems(str(tmp_path / "s.jsonl"), answer_field="solution")
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        load_problems("nope")


# ----------------------------------------------------------------- verl / SkyRL rows

VERL_ROW = {  # as verl's examples/data_preprocess/gsm8k.py writes it
    "data_source": "openai/gsm8k",
    "prompt": [
        {
            "role": "user",
            "content": 'Natalia sold 48 clips... Let\'s think step by step and output the final answer after "####".',
        }
    ],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "72"},
    "extra_info": {"split": "train", "index": 0},
}
SKYRL_ROW = {  # as SkyRL's gsm8k dataset script writes it
    "data_source": "aime24",
    "prompt": [{"role": "system", "content": "Box it."}, {"role": "user", "content": "Find x."}],
    "env_class": "aime",
    "reward_spec": {"method": "rule", "ground_truth": 25},
}


def test_verl_and_skyrl_rows(tmp_path):
    unknown = dict(VERL_ROW, data_source="my_lab/puzzles")
    (tmp_path / "v.jsonl").write_text("\n".join(json.dumps(r) for r in (VERL_ROW, SKYRL_ROW, unknown)) + "\n")
    verl, skyrl, custom = load_problems(str(tmp_path / "v.jsonl"))
    assert verl.messages == tuple(VERL_ROW["prompt"]) and verl.question == VERL_ROW["prompt"][0]["content"]
    assert (verl.answer, verl.meta["verifier"], verl.meta["data_source"], verl.meta["ability"]) == (
        "72",
        "gsm8k",
        "openai/gsm8k",
        "math",
    )
    assert skyrl.messages[0] == {"role": "system", "content": "Box it."} and skyrl.question == "Find x."
    assert (skyrl.answer, skyrl.meta["verifier"]) == ("25", "aime")
    assert "verifier" not in custom.meta  # unknown source: the run's reward.verifier scores it
    # the same rows from Parquet, as verl and SkyRL ship them
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist([VERL_ROW]), tmp_path / "train.parquet")
    assert load_problems(str(tmp_path / "train.parquet")) == [
        Problem(verl.id.replace("v-", "train-"), verl.question, "72", {**verl.meta, "source": "train"}, verl.messages)
    ]


@pytest.mark.parametrize(
    "source, verifier",
    [
        ("openai/gsm8k", "gsm8k"),
        ("lighteval/MATH", "math"),
        ("DigitalLearningGmbH/MATH-lighteval", "math"),
        ("math_dapo", "math"),
        ("aime", "aime"),
        ("AIME2025", "aime"),
        ("numina_olympiads", "math"),
        ("codecontests", None),
    ],
)
def test_data_source_picks_the_verifier(source, verifier):
    assert verifier_for_source(source) == verifier


def test_nested_and_explicit_fields(tmp_path):
    row = {
        "input": [{"role": "user", "content": "2+2?"}],
        "labels": {"final": "4"},
        "reward_model": {"ground_truth": "5"},
    }
    (tmp_path / "n.json").write_text(json.dumps([row]))
    problem = load_problems(str(tmp_path / "n.json"), problem_field="input", answer_field="labels.final")[0]
    assert (problem.question, problem.answer) == ("2+2?", "4")
    assert load_problems(str(tmp_path / "n.json"), problem_field="input")[0].answer == "5"  # reward_model.ground_truth
    (tmp_path / "l.jsonl").write_text(json.dumps({"problem": "roots?", "answer": ["1", "2"]}) + "\n")
    assert load_problems(str(tmp_path / "l.jsonl"))[0].answer == '["1", "2"]'  # kept as JSON for a custom verifier


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": [{"role": "user"}], "answer": "1"}, 'r.jsonl:1: field "prompt": message 1 has no text content'),
        (
            {"prompt": [{"role": "robot", "content": "x"}], "answer": "1"},
            "r.jsonl:1: field \"prompt\": message 1 has role 'robot'",
        ),
        ({"prompt": ["hi"], "answer": "1"}, 'r.jsonl:1: field "prompt": message 1 is str'),
        ({"prompt": [{"role": "system", "content": "x"}], "answer": "1"}, 'r.jsonl:1: field "prompt": no user message'),
        ({"prompt": {"text": "x"}, "answer": "1"}, 'r.jsonl:1: field "prompt" is dict'),
        ({"prompt": "x", "reward_model": {"ground_truth": None}}, 'r.jsonl:1: empty field "reward_model.ground_truth"'),
        ({"prompt": "x", "reward_model": {"style": "rule"}}, "r.jsonl:1: missing answer field"),
    ],
)
def test_bad_chat_rows_are_one_line_errors(tmp_path, row, message):
    (tmp_path / "r.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        load_problems(str(tmp_path / "r.jsonl"))
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------- datasets folders


def test_a_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [VERL_ROW, dict(VERL_ROW, reward_model={"style": "rule", "ground_truth": "9"})]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    problems = load_problems(str(tmp_path / "ds"))
    assert [p.answer for p in problems] == ["72", "9"] and problems[1].id == "ds-2"
    assert problems[0].messages == tuple(VERL_ROW["prompt"]) and problems[0].meta["verifier"] == "gsm8k"
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
    )
    splits.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(
        ValueError, match=r"dd: a DatasetDict with splits test, train; give one split's folder, e\.g\. .*dd/test"
    ):
        load_problems(str(tmp_path / "dd"))
    assert len(load_problems(str(tmp_path / "dd" / "train"))) == 2
    bad = [{"problem": "x", "answer": "1"}, {"problem": "y", "answer": ""}]
    datasets.Dataset.from_list(bad).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(ValueError, match=re.escape(f'{tmp_path / "bad"}:2: empty field "answer"')):
        load_problems(str(tmp_path / "bad"))
    (tmp_path / "plain_dir").mkdir()
    with pytest.raises(ValueError, match="not one written by datasets' save_to_disk"):
        load_problems(str(tmp_path / "plain_dir"))


# ----------------------------------------------------------------- reasoning-gym tasks


def test_reasoning_gym_tasks_are_scored_by_their_own_scorer():
    reasoning_gym = pytest.importorskip("reasoning_gym")
    spec = "reasoning_gym:basic_arithmetic?size=6&seed=3&max_terms=3&operators=[+,-]"
    problems = load_problems(spec)
    entries = list(reasoning_gym.create_dataset("basic_arithmetic", size=6, seed=3, max_terms=3, operators=["+", "-"]))
    assert [p.question for p in problems] == [e["question"] for e in entries]
    assert {p.meta["verifier"] for p in problems} == {"reasoning_gym"} and problems[2].id == "basic_arithmetic-3-2"
    assert len(load_problems(spec, limit=2)) == 2
    verifier = get_verifier("reasoning_gym")
    for problem, entry in zip(problems, entries):
        assert verifier(f"so <answer>{entry['answer']}</answer>", problem.answer) == Score(1.0, "ok", entry["answer"])
        assert verifier(f"\\boxed{{{entry['answer']}}}", problem.answer).reward == 1.0
        assert verifier(f"so 3 and 4 give {entry['answer']}.", problem.answer).reward == 1.0  # the last number
        assert (
            get_verifier("reasoning_gym", extract=["answer_tag"])(f"it is {entry['answer']}", problem.answer).status
            == "no_answer"
        )
        assert verifier("I do not know", problem.answer).status == "no_answer"
        assert verifier("<answer>nonsense</answer>", problem.answer).reward == 0.0
    assert get_verifier("reasoning_gym")("<answer>1</answer>", "42").status == "error"  # not a reasoning-gym reference


def test_reasoning_gym_tasks_whose_scorer_reads_the_entry():
    """countdown accepts any expression that reaches the target from the entry's numbers: the
    verifier must rebuild exactly the entry the prompt came from."""
    reasoning_gym = pytest.importorskip("reasoning_gym")
    problem = load_problems("reasoning_gym:countdown?size=3&seed=11")[1]
    entry = reasoning_gym.create_dataset("countdown", size=3, seed=11)[1]
    assert problem.question == entry["question"] and json.loads(problem.answer)["index"] == 1
    verifier = get_verifier("reasoning_gym")
    assert verifier(f"<answer>{entry['answer']}</answer>", problem.answer).reward == 1.0
    other = reasoning_gym.create_dataset("countdown", size=3, seed=11)[0]["answer"]
    assert verifier(f"<answer>{other}</answer>", problem.answer).reward < 1.0


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "reasoning_gym:basic_arithmetc",
            "reasoning-gym has no task 'basic_arithmetc'; did you mean basic_arithmetic?",
        ),
        ("reasoning_gym:basic_arithmetic?foo=1", "basic_arithmetic has no option 'foo'"),
        (
            "reasoning_gym:basic_arithmetic?min_terms=9",
            "invalid config for basic_arithmetic (max_terms must be >= min_terms)",
        ),
        ("reasoning_gym:basic_arithmetic?size", "expected key=value after '?', got 'size'"),
    ],
)
def test_bad_reasoning_gym_specs_are_one_line_errors(spec, message):
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ValueError, match=re.escape(f"{spec}: {message}")):
        load_problems(spec)


def test_a_test_set_that_shares_entries_with_train_is_a_config_error(tmp_path):
    """reasoning-gym draws entry i from seed + i: seed 1's entries are seed 0's, shifted by one."""
    pytest.importorskip("reasoning_gym")
    train = "reasoning_gym:chain_sum?size=50"
    assert load_problems("reasoning_gym:chain_sum?seed=1&size=3")[0].question == load_problems(train)[1].question
    config = tmp_path / "c.yaml"
    for test, refused in [
        ("seed=1", True),
        ("seed=49&size=10", True),
        ("seed=0", True),
        ("seed=50", False),
        ("seed=1&max_terms=3", False),
    ]:
        config.write_text(f"model: {{path: m}}\ndata: {{train: '{train}', test: 'reasoning_gym:chain_sum?{test}'}}\n")
        if refused:
            with pytest.raises(ConfigError, match="shares entries with data.train"):
                load_config(config)
        else:
            assert load_config(config).data.test.endswith(test)


def test_reasoning_gym_scores_in_the_sandboxed_pool():
    """The pool's workers (spawned, memory-capped) rebuild the entries from the reference alone."""
    reasoning_gym = pytest.importorskip("reasoning_gym")
    from rlvr.rewards.pool import ScoringPool

    problems = load_problems("reasoning_gym:chain_sum?size=4&seed=5")
    entries = reasoning_gym.create_dataset("chain_sum", size=4, seed=5)
    responses = [
        f"<answer>{entries[i]['answer']}</answer>" if i % 2 == 0 else "<answer>-99999</answer>" for i in range(4)
    ]
    with ScoringPool("math", workers=1, timeout_s=10.0) as pool:
        scores = pool.score(responses, [p.answer for p in problems], [p.meta["verifier"] for p in problems])
    assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 0.0] and {s.status for s in scores} == {"ok"}


@pytest.mark.slow
def test_a_run_trains_and_evaluates_on_a_reasoning_gym_task(tmp_path):
    """The whole path: prompts from the task, rewards from its scorer in the pool, eval rows."""
    pytest.importorskip("reasoning_gym")
    from run_fixtures import small_config, step_rows, train

    task = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&max_digits=1"
    config = small_config(
        tmp_path,
        "rg",
        steps=1,
        data={
            "train": f"{task}&size=16&seed=0",
            "test": f"{task}&size=2&seed=16",
            "template": "{question} Answer in \\boxed{}.",
        },
        reward={"verifier": "reasoning_gym"},
    )
    result = train(config)
    assert result.returncode == 0, result.stdout[-3000:]
    assert len(step_rows(tmp_path / "rg")) == 1
    rows = [json.loads(line) for line in (tmp_path / "rg" / "eval" / "after.jsonl").read_text().splitlines()]
    assert rows and all(json.loads(r["answer"])["task"] == "chain_sum" for r in rows)
    assert {r["status"] for r in rows} <= {"ok", "no_answer"}  # "error" would mean the pool could not rebuild the entry
