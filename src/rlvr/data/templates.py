"""Prompt templates by name, and problems rendered as chat messages or a prompt string.

A template is an optional system message plus a user message with `{question}` in it.
`build_prompt` formats the messages with the tokenizer's chat template
(`apply_chat_template(..., add_generation_prompt=True)`); a tokenizer without one (or none at
all) gets the raw text: the system message, a blank line, then the user message.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.records import Problem

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


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
}


def get_template(name: str) -> Template:
    if name not in TEMPLATES:
        raise ValueError(f"unknown prompt template {name!r}; choose from {sorted(TEMPLATES)}")
    return TEMPLATES[name]


def chat_messages(problem: Problem, template: str = "boxed") -> list[dict[str, str]]:
    """The problem as chat messages (`[{"role": ..., "content": ...}]`)."""
    t = get_template(template)
    # str.replace, not str.format: questions are full of LaTeX braces.
    messages = [{"role": "user", "content": t.user.replace("{question}", problem.question)}]
    if t.system is not None:
        messages.insert(0, {"role": "system", "content": t.system})
    return messages


def build_prompt(problem: Problem, tokenizer=None, template: str = "boxed") -> str:
    """The prompt string the engine sees (rules in the module doc)."""
    messages = chat_messages(problem, template)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages)
