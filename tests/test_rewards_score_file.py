"""`score_file`: rows in, rows plus reward/status out; bad rows named by file and line."""

import json

import pytest

from rlvr.rewards.score_file import score_file


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "in.jsonl:2: not valid JSON"),
        ('{"response": "x"}', 'in.jsonl:2: missing field "answer"'),
        ('{"answer": "1"}', 'in.jsonl:2: missing field "response"'),
        ('{"response": "x", "answer": 1}', 'in.jsonl:2: field "answer" must be a string'),
        ("[1, 2]", "in.jsonl:2: expected a JSON object"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, line, message):
    src = tmp_path / "in.jsonl"
    write_lines(src, ['{"response": "\\\\boxed{1}", "answer": "1"}', line])
    with pytest.raises(ValueError, match=message):
        score_file(src, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_scores_rows_with_per_row_verifier_and_skips_bad(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [
        {"response": "so \\boxed{0.5}", "answer": "\\frac12", "id": 7},
        {"response": "no answer here", "answer": "3"},
        {"response": "#### 1,234", "answer": "1234", "verifier": "gsm8k"},
    ]
    write_lines(src, [json.dumps(rows[0]), "oops", json.dumps(rows[1]), "", json.dumps(rows[2])])
    counts = score_file(src, out, skip_bad=True, workers=1)
    assert counts == {"ok": 2, "no_answer": 1, "timeout": 0, "error": 0, "skipped": 1}
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["reward"], r["status"]) for r in scored] == [(1.0, "ok"), (0.0, "no_answer"), (1.0, "ok")]
    assert scored[0]["id"] == 7 and scored[0]["extracted"] == "0.5"


def run_score(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "rlvr.cli", "score", *map(str, args)], capture_output=True, text=True)


def test_cli_options_reach_the_verifier_and_bad_ones_are_one_line(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(src, [json.dumps({"response": "The answer is 5.", "answer": "5"})])
    done = run_score(
        src, "-o", out, "--verifier", "math", "--workers", "1", "--option", "extract=boxed,answer,last_number"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["reward"] == 1.0
    plain = run_score(src, "-o", out, "--workers", "1")
    assert plain.returncode == 0 and json.loads(out.read_text())["status"] == "no_answer"
    # piped (not a terminal: Rich's 80 columns), a long output path still gives one summary line
    deep = tmp_path / ("a-folder-with-a-long-name-" * 4) / "out.jsonl"
    deep.parent.mkdir()
    piped = run_score(src, "-o", deep, "--workers", "1")
    summary = [line for line in piped.stderr.splitlines() if line.strip()]
    assert (
        piped.returncode == 0
        and len(summary) == 1
        and summary[0].startswith("scored 1 rows -> ")
        and len(summary[0]) > 80
    )
    for option, message in [
        ("colour=red", "unknown option 'colour'"),
        ("percent=half", "option percent='half': choose from either, ratio, number"),
        ("extract=boxed,sideways", "option extract: unknown mode(s) ['sideways']"),
        ("oops", "option 'oops': expected key=value"),
    ]:
        bad = run_score(src, "-o", tmp_path / "bad.jsonl", "--option", option)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stdout + bad.stderr, option
        assert not (tmp_path / "bad.jsonl").exists()


def test_parse_option_types():
    from rlvr.rewards.verifiers import parse_option

    assert parse_option("extract=boxed,answer") == ("extract", ["boxed", "answer"])
    assert parse_option("ignore_case=False") == ("ignore_case", False)
    assert parse_option("bonus=0.5") == ("bonus", 0.5)
    assert parse_option("reasoning_end=") == ("reasoning_end", "")
    assert parse_option("extract=answer") == ("extract", "answer")
