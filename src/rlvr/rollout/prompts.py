"""Problems and their prompt token ids: the one encoder of a dataset for an engine.

Training, its periodic evaluation, `rlvr eval` and the demo's warm start all render a problem
through `encode_prompt`, so the same `data` section gives the same token ids everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.config import DataConfig, EnvConfig
from rlvr.data.datasets import load_problems
from rlvr.data.templates import build_prompt, chat_messages
from rlvr.models.tokenizer import chat_ids, has_chat_template, is_mistral_tokenizer
from rlvr.records import Problem

PROBE_SIZE = 4  # sequences the sync check scores after every weight push


@dataclass
class PromptSet:
    """Problems and their tokenised prompts, index-aligned."""

    problems: list[Problem]
    prompts: list[list[int]]
    source: str = ""  # the data file or set they were read from, for messages

    def longest(self) -> tuple[int, int] | None:
        """(index, length) of the longest prompt; None for an empty set."""
        if not self.prompts:
            return None
        index = max(range(len(self.prompts)), key=lambda i: len(self.prompts[i]))
        return index, len(self.prompts[index])

    def where(self, index: int) -> str:
        """`source: problem #N (id ID)`: the problem at `index` as a user finds it in the data."""
        return f"{self.source}: problem #{index + 1} (id {self.problems[index].id})"

    def shared_with(self, other: PromptSet) -> int:
        """How many of this set's prompts also occur in `other`, token for token: a test problem
        the policy also trained on is not held out."""
        seen = {tuple(prompt) for prompt in other.prompts}
        return sum(tuple(prompt) in seen for prompt in self.prompts)

    def probe(self, tokenizer) -> list[tuple[list[int], list[int]]]:
        """A fixed probe for the sync check: the first prompts, each completed by its reference
        answer in a box (tokens the policy gives a definite, non-trivial probability)."""
        return [
            (prompt, tokenizer(f"\\boxed{{{problem.answer}}}", add_special_tokens=False).input_ids)
            for problem, prompt in list(zip(self.problems, self.prompts))[:PROBE_SIZE]
        ]


def encode_prompt(problem: Problem, tokenizer, data: DataConfig) -> list[int]:
    """The prompt's token ids: the template, in the tokenizer's chat template if asked (rendered
    to ids directly: see `rlvr.models.tokenizer`)."""

    if data.chat_template and has_chat_template(tokenizer):
        return chat_ids(tokenizer, chat_messages(problem, data.template, data.system_prompt))
    text = build_prompt(problem, None, data.template, data.system_prompt)
    return tokenizer(text, add_special_tokens=False).input_ids


class Renderer:
    """Token ids of what the model reads: prompts (`encode_prompt`, or an environment's messages)
    and, between turns, observations rendered alone.

    An observation's tokens are the chat template's delta: the text the template puts after an
    assistant message and before the next one (its end-of-turn, then the new messages and the
    next assistant header), found by rendering a fixed two-message conversation with and
    without the new messages. Earlier turns are never rendered again, so a template that
    rewrites history (one that strips reasoning from past assistant turns) cannot change a
    token the model sampled. mistral-common renders only to ids (`rlvr.models.tokenizer`): there
    the delta is the ids after the marked assistant message's own. Without a chat template an
    observation is its messages' text on lines of its own.
    """

    _MARK = "rlvr-assistant-turn"

    def __init__(self, tokenizer, data: DataConfig):
        self.tokenizer, self.data = tokenizer, data
        self.chat = data.chat_template and has_chat_template(tokenizer)
        self.end_of_turn_id = tokenizer.eos_token_id

    def prompt(self, problem: Problem, messages: list[dict] | None = None) -> list[int]:
        """The first turn's prompt: the row rendered by data.template, or an environment's own messages."""
        if messages is None:
            return encode_prompt(problem, self.tokenizer, self.data)
        if self.chat:
            return chat_ids(self.tokenizer, messages)
        return self._ids("\n\n".join(m["content"] for m in messages))

    def observation(self, messages: list[dict], ended_turn: bool) -> list[int]:
        """The tokens after a turn the model ended (`ended_turn`: with its end-of-turn token) or
        that was stopped (then the end of turn is appended too), through the next assistant header."""
        if not self.chat:
            return self._ids("\n" + "\n".join(m["content"] for m in messages) + "\n")
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": self._MARK}]
        if is_mistral_tokenizer(self.tokenizer):
            return self._observation_ids(base + messages, ended_turn)
        before = self.tokenizer.apply_chat_template(base, tokenize=False)
        after = self.tokenizer.apply_chat_template(base + messages, tokenize=False, add_generation_prompt=True)
        if not after.startswith(before) or self._MARK not in before:
            raise ValueError(
                "the model's chat template renders a conversation differently once messages follow it; "
                "rlvr cannot render an observation alone (set data.chat_template: false)"
            )
        end_of_turn = before[before.rindex(self._MARK) + len(self._MARK) :]
        eos = self.tokenizer.eos_token or ""
        if ended_turn and eos and eos in end_of_turn:
            end_of_turn = end_of_turn[end_of_turn.index(eos) + len(eos) :]
        return self._ids(end_of_turn + after[len(before) :])

    def _observation_ids(self, conversation: list[dict], ended_turn: bool) -> list[int]:
        ids, mark = chat_ids(self.tokenizer, conversation), self._ids(self._MARK)
        ends = [i + len(mark) for i in range(len(ids) - len(mark) + 1) if ids[i : i + len(mark)] == mark]
        if len(ends) != 1:
            raise ValueError(
                "the model's tokenizer does not render an assistant message as its own text's tokens; "
                "rlvr cannot render an observation alone (set data.chat_template: false)"
            )
        tail = ids[ends[0] :]
        return tail[1:] if ended_turn and tail[:1] == [self.end_of_turn_id] else tail

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids


def load_prompt_set(data: DataConfig, source: str, tokenizer, limit: int | None = None) -> PromptSet:
    """The problems of `source` (a built-in name or a file), read with `data`'s field names and
    encoded with its template; a prompt over data.max_prompt_tokens is an error naming it."""

    problems = load_problems(source, problem_field=data.problem_field, answer_field=data.answer_field, limit=limit)
    prompts = [encode_prompt(p, tokenizer, data) for p in problems]
    prompt_set = PromptSet(problems, prompts, source)
    longest = prompt_set.longest()
    if longest is not None and longest[1] > data.max_prompt_tokens:
        raise ValueError(
            f"{prompt_set.where(longest[0])} has {longest[1]} prompt tokens, more than "
            f"data.max_prompt_tokens={data.max_prompt_tokens}"
        )
    return prompt_set


def engine_context(
    prompt_sets: list[PromptSet],
    *,
    max_tokens: int,
    env: EnvConfig | None,
    max_model_len: int | None,
    positions: int | None,
    model: str,
) -> int:
    """The engine's max_model_len for these prompts (`context_length` of the longest of them)."""
    prompt_set, index, tokens = max(
        ((s, *longest) for s in prompt_sets if (longest := s.longest()) is not None),
        key=lambda x: x[2],
        default=(None, 0, 0),
    )
    return context_length(
        tokens,
        prompt_set.where(index) if prompt_set else "no prompt",
        max_tokens=max_tokens,
        env=env,
        max_model_len=max_model_len,
        positions=positions,
        model=model,
    )


def check_max_model_len(max_model_len: int | None, positions: int | None, model: str) -> None:
    """A ValueError where engine.max_model_len is longer than the model's `positions` allow."""
    if max_model_len is not None and positions is not None and max_model_len > positions:
        raise ValueError(
            f"engine.max_model_len={max_model_len} exceeds the model's max_position_embeddings={positions} ({model})"
        )


def context_length(
    longest_prompt: int,
    where: str,
    *,
    max_tokens: int,
    env: EnvConfig | None,
    max_model_len: int | None,
    positions: int | None,
    model: str,
) -> int:
    """The engine's max_model_len, one rule for `rlvr train`, `rlvr eval` and the plan: `max_model_len`
    when given, else the longest prompt + `max_tokens`, never past the model's `positions`. A
    multi-turn `env` (None: one answer per prompt) adds room for max_turns - 1 more answers and the
    observations before them (a cut observation is about max_observation_chars tokens; a turn that
    does not fit ends its trajectory with finish_reason 'length'). Every prompt must fit with
    its first answer (prompt + max_tokens): the longest (`where`) not fitting is an error naming it,
    not a run that skips it (a held-out score over fewer problems than asked is not the score
    asked for; verl's default, data.truncation 'error', also stops)."""
    check_max_model_len(max_model_len, positions, model)
    if max_model_len is None:
        limit, by = positions, "the model's max_position_embeddings"
    else:
        limit, by = max_model_len, "engine.max_model_len"
    if limit is not None and longest_prompt + max_tokens > limit:
        raise ValueError(
            f"{where} has {longest_prompt} prompt tokens: with rollout.sampling.max_tokens={max_tokens} that "
            f"is {longest_prompt + max_tokens}, more than {by}={limit} ({model})"
        )
    if max_model_len is not None:
        return max_model_len
    later_turns = (
        0
        if env is None or env.name == "single_turn"
        else (env.max_turns - 1) * (max_tokens + env.max_observation_chars)
    )
    wanted = longest_prompt + max_tokens + later_turns
    return min(wanted, positions) if positions is not None else wanted
