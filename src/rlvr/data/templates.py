"""Prompt templates, and problems rendered as chat messages or a prompt string.

A template is an optional system message plus a user message with `{question}` in it. It is
given as a built-in name (`TEMPLATES`) or as inline text holding `{question}`, which becomes
the user message (`"Q: {question}\\nA:"`). `auto` is each problem's own: a built-in set that
is not math names the prompt its model cards evaluate with (`meta["template"]`: HumanEval's
is `code`), and every other problem gets `boxed`. `system_prompt`, when given, is the system message
and replaces the template's own.

A problem that carries its own chat messages (a verl/SkyRL row's `prompt`) is sent as they are:
the template does not apply, and `system_prompt` is put first only when they have no system
message.

`build_prompt` formats the messages with the tokenizer's chat template
(`apply_chat_template(..., add_generation_prompt=True)`); a tokenizer without one (or none at
all) gets the raw text: the messages' contents joined by a blank line.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.records import Problem

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
QUESTION = "{question}"


@dataclass(frozen=True)
class Template:
    user: str  # must contain "{question}"
    system: str | None = None


TEMPLATES: dict[str, Template] = {
    # The common RLVR prompt: instruction after the question.
    "boxed": Template("{question}\n" + BOXED_INSTRUCTION),
    # Qwen2.5-Math style: the same instruction as the system message.
    "boxed_system": Template("{question}", system=BOXED_INSTRUCTION),
    # GSM8K's own convention, scored by the `gsm8k` verifier.
    "gsm8k": Template("{question}\nSolve step by step, then give the final number on its own line after '####'."),
    "plain": Template("{question}"),
    # EvalPlus's instruction for chat models, with which the Qwen2.5-Coder and most code model
    # cards report HumanEval: the stub in a fence, the answer a whole program in a fence. EvalPlus
    # leaves the stub's fence untagged and starts the answer with "```python" itself; with no
    # answer prefix, a 0.5B coder copied the untagged fence and put "python" on the program's first
    # line (111 of 164 HumanEval answers), so the fence here is tagged.
    "code": Template(
        "Please provide a self-contained Python script that solves the following problem in a markdown "
        "code block:\n```python\n{question}\n```"
    ),
}
AUTO = "auto"
DEFAULT_TEMPLATE = "boxed"  # what `auto` gives a problem that names no template of its own


def get_template(name_or_text: str) -> Template:
    """The built-in template `name_or_text`, or inline text holding `{question}` as the user message
    (`auto` is not one: `problem_template` resolves it per problem first)."""
    if name_or_text in TEMPLATES:
        return TEMPLATES[name_or_text]
    if QUESTION in name_or_text:
        return Template(name_or_text)
    raise ValueError(
        f"unknown prompt template {name_or_text!r}: give a built-in name ({', '.join(sorted([AUTO, *TEMPLATES]))}) "
        "or text containing {question}"
    )


def problem_template(problem: Problem, template: str) -> str:
    """The template `problem` is rendered with: `template`, or under `auto` the problem's own."""
    return problem.meta.get("template", DEFAULT_TEMPLATE) if template == AUTO else template


def chat_messages(problem: Problem, template: str = AUTO, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The problem as chat messages (`[{"role": ..., "content": ...}]`), rules in the module doc."""
    if problem.messages:
        messages = [dict(m) for m in problem.messages]
        if system_prompt is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": system_prompt})
        return messages
    t = get_template(problem_template(problem, template))
    # str.replace, not str.format: questions are full of LaTeX braces.
    messages = [{"role": "user", "content": t.user.replace(QUESTION, problem.question)}]
    system = system_prompt if system_prompt is not None else t.system
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def build_prompt(problem: Problem, tokenizer=None, template: str = AUTO, system_prompt: str | None = None) -> str:
    """The prompt string the engine sees (rules in the module doc)."""
    messages = chat_messages(problem, template, system_prompt)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages)
