"""Problems and their prompt token ids: the one encoder of a dataset for an engine.

Training, its periodic evaluation, `rlvr eval` and the demo's warm start all render a problem
through `encode_prompt`, so the same `data` section gives the same token ids everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.config import DataConfig
from rlvr.records import Problem

PROBE_SIZE = 4  # sequences the sync check scores after every weight push


@dataclass
class PromptSet:
    """Problems and their tokenised prompts, index-aligned."""

    problems: list[Problem]
    prompts: list[list[int]]

    def probe(self, tokenizer) -> list[tuple[list[int], list[int]]]:
        """A fixed probe for the sync check: the first prompts, each completed by its reference
        answer in a box (tokens the policy gives a definite, non-trivial probability)."""
        return [
            (prompt, tokenizer(f"\\boxed{{{problem.answer}}}", add_special_tokens=False).input_ids)
            for problem, prompt in list(zip(self.problems, self.prompts))[:PROBE_SIZE]
        ]


def encode_prompt(problem: Problem, tokenizer, data: DataConfig) -> list[int]:
    """The prompt's token ids: the template, in the tokenizer's chat template if asked."""
    from rlvr.data.templates import build_prompt

    text = build_prompt(problem, tokenizer if data.chat_template else None, data.template)
    return tokenizer(text, add_special_tokens=False).input_ids


def load_prompt_set(data: DataConfig, source: str, tokenizer, limit: int | None = None) -> PromptSet:
    """The problems of `source` (a built-in name or a file), read with `data`'s field names and
    encoded with its template; a prompt over data.max_prompt_tokens is an error naming it."""
    from rlvr.data.datasets import load_problems

    problems = load_problems(source, problem_field=data.problem_field, answer_field=data.answer_field, limit=limit)
    prompts = [encode_prompt(p, tokenizer, data) for p in problems]
    too_long = next((p.id for p, ids in zip(problems, prompts) if len(ids) > data.max_prompt_tokens), None)
    if too_long is not None:
        raise ValueError(f"{source}: problem {too_long} is longer than data.max_prompt_tokens={data.max_prompt_tokens}")
    return PromptSet(problems, prompts)
