"""reasoning-gym's procedural tasks as problem sets: `reasoning_gym:TASK[?key=value&...]`.

`TASK` is any name reasoning-gym registers (`basic_arithmetic`, `chain_sum`, `countdown`...);
the `key=value` pairs are that task's config fields (values read as YAML scalars or lists,
e.g. `?size=200&seed=1&max_terms=3&operators=[+,-]`). `seed` defaults to 0 (reasoning-gym's own
default is a random seed, which no scoring worker could reproduce), `size` to the task's default.
reasoning-gym draws entry i from the random seed `seed + i`, so two specs of a task share entries
when their ranges [seed, seed + size) overlap (seed 1's entry 0 is seed 0's entry 1): a held-out
set needs a seed past the training range, e.g. train `seed=0&size=2000`, test `seed=100000`.

Problem i is the task's entry i: its `question`, and as the answer the entry's address (task,
config, index), from which the `reasoning_gym` verifier rebuilds the entry and scores with the
task's own `score_answer` (`rlvr.rewards.reasoning_gym`). `meta["verifier"]` names it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json

import yaml

from rlvr.records import Problem

PREFIX = "reasoning_gym:"
VERIFIER = "reasoning_gym"  # the verifier a problem of these sets names in meta["verifier"]


def is_reasoning_gym_spec(source: str) -> bool:
    return source.startswith(PREFIX)


def parse_spec(spec: str) -> tuple[str, dict]:
    """`reasoning_gym:TASK?k=v&...` as (TASK, {k: v}), values parsed as YAML."""
    task, _, query = spec[len(PREFIX) :].partition("?")
    options = {}
    for item in filter(None, query.split("&")):
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{spec}: expected key=value after '?', got {item!r}")
        try:
            options[key] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ValueError(
                f"{spec}: cannot read the value of {key!r} ({text!r}) as YAML; quote odd items, e.g. ['*']"
            ) from None
    if not task:
        raise ValueError(f"{spec}: no task name after {PREFIX!r}")
    return task, options


def task_config(spec: str) -> tuple[str, dict]:
    """(TASK, the options `spec` gives plus the seed) as JSON values, checked against the task's config class."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise ValueError(
            f"{spec}: reasoning-gym tasks need the reasoning-gym package (pip install 'rlvr[data]')"
        ) from None
    task, options = parse_spec(spec)
    if task not in DATASETS:
        close = difflib.get_close_matches(task, list(DATASETS), n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; e.g. {', '.join(sorted(DATASETS)[:5])}"
        raise ValueError(f"{spec}: reasoning-gym has no task {task!r}{hint}")
    config_cls = DATASETS[task][1]
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(f"{spec}: {task} has no option {unknown[0]!r}; its options: {', '.join(sorted(fields))}")
    if "seed" in fields:
        options.setdefault("seed", 0)
    try:
        config = config_cls(**options)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, TypeError, ValueError) as err:
        raise ValueError(f"{spec}: invalid config for {task} ({err or type(err).__name__})") from None
    try:  # what the scoring worker rebuilds the task from, so the problems are made from it too
        return task, json.loads(json.dumps(options))
    except TypeError as err:
        raise ValueError(f"{spec}: {task}'s config cannot be written as JSON ({err})") from None


def reference(task: str, config: dict, index: int) -> str:
    """The reference string that addresses entry `index` of `task` under `config`."""
    return json.dumps({"task": task, "config": config, "index": index}, sort_keys=True, separators=(",", ":"))


def draws_overlap(train_spec: str, test_spec: str) -> bool:
    """Whether two specs share entries: the same task and options, overlapping seed ranges."""
    (task_a, a), (task_b, b) = task_config(train_spec), task_config(test_spec)
    same_options = {k: v for k, v in a.items() if k not in ("seed", "size")} == {
        k: v for k, v in b.items() if k not in ("seed", "size")
    }
    if task_a != task_b or not same_options or "seed" not in a:
        return False
    sizes = [c.get("size", _default_size(task_a)) for c in (a, b)]
    return a["seed"] < b["seed"] + sizes[1] and b["seed"] < a["seed"] + sizes[0]


def _default_size(task: str) -> int:
    from reasoning_gym.factory import DATASETS

    return DATASETS[task][1]().size


def reasoning_gym_problems(spec: str, limit: int | None = None) -> list[Problem]:
    """The task's entries as problems (rules in the module doc)."""
    import reasoning_gym

    task, config = task_config(spec)
    dataset = reasoning_gym.create_dataset(task, **config)
    count = len(dataset) if limit is None else min(limit, len(dataset))
    return [
        Problem(
            id=f"{task}-{config.get('seed')}-{index}",
            question=dataset[index]["question"],
            answer=reference(task, config, index),
            meta={"source": f"{PREFIX}{task}", "verifier": VERIFIER},
        )
        for index in range(count)
    ]
