"""Built-in datasets, the file loader's field mapping and errors, and prompt templates."""

import json

import pytest

from rlvr.data.datasets import BUILTIN, load_problems
from rlvr.data.templates import BOXED_INSTRUCTION, build_prompt, chat_messages
from rlvr.records import Problem

SIZES = {"aime2024": 30, "math500": 500, "gsm8k": 1319, "gsm8k_train": 7473, "math_train": 7470, "aime_1983_2023": 975, "deepmath5k": 4994}


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
        ('{"problem": "x"}\n', 's.jsonl:1: missing answer field'),
        ('{"problem": "x", "answer": "1"}\n{bad\n', "s.jsonl:2: not valid JSON"),
        ('{"problem": "x", "answer": ""}\n', 's.jsonl:1: empty field "answer"'),
        ('[1]\n', "s.jsonl:1: expected a JSON object"),
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


class FakeTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_templates():
    problem = Problem("1", "What is $\\frac{1}{2}+{x}$?", "1")
    assert build_prompt(problem) == "What is $\\frac{1}{2}+{x}$?\n" + BOXED_INSTRUCTION
    assert chat_messages(problem, "boxed_system")[0] == {"role": "system", "content": BOXED_INSTRUCTION}
    assert build_prompt(problem, FakeTokenizer(), "plain") == "<user>What is $\\frac{1}{2}+{x}$?<assistant>"
    with pytest.raises(ValueError, match="unknown prompt template"):
        chat_messages(problem, "fancy")
