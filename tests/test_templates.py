"""Prompt templates: built-in names, inline text, a system prompt, and rows with their own messages."""

import pytest

from rlvr.config import ConfigError, load_config
from rlvr.data.templates import BOXED_INSTRUCTION, TEMPLATES, build_prompt, chat_messages
from rlvr.models.tiny import build_char_tokenizer
from rlvr.records import Problem

QUESTION = "What is $\\frac{1}{2}+{x}$?"
PROBLEM = Problem("1", QUESTION, "1")


class FakeTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_builtin_names():
    assert build_prompt(PROBLEM) == QUESTION + "\n" + BOXED_INSTRUCTION
    assert chat_messages(PROBLEM, "boxed_system")[0] == {"role": "system", "content": BOXED_INSTRUCTION}
    assert build_prompt(PROBLEM, FakeTokenizer(), "plain") == f"<user>{QUESTION}<assistant>"
    with pytest.raises(ValueError, match="unknown prompt template 'fancy'.*containing \\{question\\}"):
        chat_messages(PROBLEM, "fancy")


def test_auto_is_each_problems_own_template(tmp_path):
    from rlvr.data.humaneval import load_humaneval

    # a file's row or a math set's problem names none: boxed, as before there was auto
    assert chat_messages(PROBLEM, "auto") == chat_messages(PROBLEM, "boxed")
    (tmp_path / "c.yaml").write_text("model: {path: m}\ndata: {train: gsm8k}\n")
    assert load_config(tmp_path / "c.yaml").data.template == "auto"  # the default
    # HumanEval's stub goes in a fence under EvalPlus's instruction, not under "put your final
    # answer within \\boxed{}" (a 0.5B coder answered HumanEval/2 "The final answer is \\boxed{0.5}")
    stub = load_humaneval(limit=1)[0]
    (message,) = chat_messages(stub, "auto")
    assert message["content"] == TEMPLATES["code"].user.replace("{question}", stub.question)
    assert message["content"].endswith(f"```python\n{stub.question}\n```") and "boxed" not in message["content"]
    assert chat_messages(stub, "plain") == [{"role": "user", "content": stub.question}]  # a name given still wins


def test_inline_text_and_system_prompt():
    # braces in the question and in the template other than {question} are left alone
    assert chat_messages(PROBLEM, "Q: {question}\nA: {answer}") == [
        {"role": "user", "content": f"Q: {QUESTION}\nA: {{answer}}"}
    ]
    assert chat_messages(PROBLEM, "plain", system_prompt="Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": QUESTION},
    ]
    # the system prompt replaces a built-in template's own
    assert chat_messages(PROBLEM, "boxed_system", system_prompt="Be brief.")[0]["content"] == "Be brief."
    assert build_prompt(PROBLEM, None, "Q: {question}", system_prompt="S") == f"S\n\nQ: {QUESTION}"


def test_a_real_chat_template_renders_them():
    tokenizer = build_char_tokenizer()
    text = build_prompt(PROBLEM, tokenizer, "Q: {question}", system_prompt="Be brief.")
    assert (
        text
        == f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ: {QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_rows_with_their_own_messages_keep_them():
    few_shot = (
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "\\boxed{2}"},
        {"role": "user", "content": "2+2?"},
    )
    problem = Problem("2", "2+2?", "4", messages=few_shot)
    assert chat_messages(problem, "boxed") == list(few_shot)  # the template does not apply
    assert chat_messages(problem, "boxed", system_prompt="S") == [{"role": "system", "content": "S"}, *few_shot]
    with_system = Problem("3", "2+2?", "4", messages=({"role": "system", "content": "own"}, *few_shot))
    assert chat_messages(with_system, "boxed", system_prompt="S")[0] == {"role": "system", "content": "own"}
    assert build_prompt(problem, FakeTokenizer()) == "<user>1+1?<assistant>\\boxed{2}<user>2+2?<assistant>"
    assert Problem("4", "q", "a").messages is None  # the field is optional: old call sites are unchanged


def test_config_accepts_names_and_inline_text_and_rejects_the_rest(tmp_path):
    config = tmp_path / "c.yaml"
    for written, read in [
        ("auto", "auto"),
        *((name, name) for name in TEMPLATES),
        ("Q: {question}\\nA:", "Q: {question}\nA:"),
    ]:
        config.write_text(
            f'model: {{path: m}}\ndata: {{train: gsm8k, template: "{written}", system_prompt: "Be brief."}}\n'
        )
        cfg = load_config(config)
        assert (cfg.data.template, cfg.data.system_prompt) == (read, "Be brief.")
    config.write_text("model: {path: m}\ndata: {train: gsm8k, template: fancy}\n")
    with pytest.raises(ConfigError, match="data.template: .*unknown prompt template 'fancy'"):
        load_config(config)


def test_test_problems_that_occur_in_training_are_counted():
    from rlvr.rollout.prompts import PromptSet

    train = PromptSet(problems=[None] * 3, prompts=[[1, 2], [3, 4], [5]])
    test = PromptSet(problems=[None] * 3, prompts=[[3, 4], [3], [5]])
    assert test.shared_with(train) == 2  # token for token: [3] is not [3, 4]
