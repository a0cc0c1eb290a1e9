"""reasoning-gym's own scorers as the verifier `reasoning_gym`.

A reasoning-gym problem's reference (`rlvr.data.reasoning_gym.reference()`) is
the address of its entry, `{"task": ..., "config": {...}, "index": i}`, not an answer: many
tasks score with the entry's metadata, and some have no single answer at all. The verifier
rebuilds the entry as `create_dataset(task, **config)[index]` (reasoning-gym draws entry i from
`seed + i` alone, so it is the entry the prompt came from) and returns the task's
`score_answer(answer, entry)`, which may give partial credit.

The answer is read, in the order of `extract`, from the last `<answer>...</answer>`
("answer_tag", reasoning-gym's convention), the last `\\boxed{}` ("boxed"), the last number
written ("last_number", the lenient match GSM8K scorers fall back to, so that a model that has
not learnt a format yet still earns its right numbers) or the whole response ("whole"). None
found -> status "no_answer". A task whose answers are not numbers usually scores a stray number 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache

from rlvr.records import Score
from rlvr.rewards.extract import boxed_answers, last_number

EXTRACT_MODES = ("answer_tag", "boxed", "last_number", "whole")


@lru_cache(maxsize=64)
def _dataset(task: str, config_json: str):
    import reasoning_gym

    return reasoning_gym.create_dataset(task, **json.loads(config_json))


@lru_cache(maxsize=4096)  # the samples of one prompt share an entry
def _entry(task: str, config_json: str, index: int) -> dict:
    return _dataset(task, config_json)[index]


def _extract(response: str, modes: tuple[str, ...]) -> str | None:
    from reasoning_gym.utils import extract_answer

    for mode in modes:
        if mode == "answer_tag":
            found = extract_answer(response)
        elif mode == "boxed":
            found = (boxed_answers(response) or [None])[-1]
        elif mode == "last_number":
            found = last_number(response)
        else:
            found = response.strip()
        if found:
            return found
    return None


def reasoning_gym_verifier(*, extract: Sequence[str] = ("answer_tag", "boxed", "last_number")):
    """`(response, reference) -> Score` with the referenced task's own scorer (module doc)."""
    modes = (extract,) if isinstance(extract, str) else tuple(extract)
    if not modes or any(m not in EXTRACT_MODES for m in modes):
        raise ValueError(f"extract {modes!r}: choose from {', '.join(EXTRACT_MODES)}")
    import reasoning_gym  # noqa: F401  imported here, while the scoring pool allows a verifier time to load

    def score(response: str, ref: str) -> Score:
        try:
            address = json.loads(ref)
            task, config, index = address["task"], address["config"], address["index"]
        except (ValueError, TypeError, KeyError):
            return Score(0.0, "error", None)  # not a reasoning-gym reference: the wrong verifier for this row
        config_json = json.dumps(config, sort_keys=True)
        answer = _extract(response, modes)
        if answer is None:
            return Score(0.0, "no_answer", None)
        dataset = _dataset(task, config_json)
        return Score(float(dataset.score_answer(answer, _entry(task, config_json, index))), "ok", answer)

    return score
