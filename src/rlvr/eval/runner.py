"""One evaluation pass: generate n samples per problem, score them, summarise, save samples.

The same function serves `rlvr eval` and the periodic eval during training, so the numbers
of both are computed identically. It knows the engine and the scorer only by their methods:

    engine.generate(prompts: list[list[int]], n: int, sampling: Sampling, progress=...) -> list[Rollout]
    scorer.score(responses: list[str], answers: list[str], progress=...) -> list[Score]
"""

from __future__ import annotations

from typing import Protocol

from rlvr.config import EvalConfig, SamplingConfig
from rlvr.eval.metrics import check_ks
from rlvr.eval.rollouts_file import SampleRow, summarize_rows, write_samples
from rlvr.records import Problem, Rollout, Sampling, Score
from rlvr.tracking.progress import Advance, RunProgress, phase


class Generates(Protocol):
    def generate(
        self, prompts: list[list[int]], n: int, sampling: Sampling, *, progress: Advance | None
    ) -> list[Rollout]: ...


class Scores(Protocol):
    def score(self, responses: list[str], answers: list[str], *, progress: Advance | None) -> list[Score]: ...


def held_out_sampling(eval: EvalConfig, sampling: SamplingConfig, seed: int) -> Sampling:
    """How a run's held-out evaluation samples: the training rollouts' length and stop strings,
    the evaluation's temperature, no nucleus, the run's seed (`rlvr eval --run` samples so too)."""
    return Sampling(
        temperature=eval.temperature, top_p=1.0, max_tokens=sampling.max_tokens, stop=tuple(sampling.stop), seed=seed
    )


def _group_by_prompt(rollouts: list[Rollout], n_prompts: int, n: int) -> list[list[Rollout]]:
    """Rollouts per prompt, in the order the engine returned them (= sample index)."""
    groups: list[list[Rollout]] = [[] for _ in range(n_prompts)]
    for rollout in rollouts:
        if not 0 <= rollout.prompt_index < n_prompts:
            raise ValueError(
                f"engine returned a rollout for prompt {rollout.prompt_index}, but only {n_prompts} were given"
            )
        groups[rollout.prompt_index].append(rollout)
    for index, group in enumerate(groups):
        if len(group) != n:
            raise ValueError(f"engine returned {len(group)} samples for prompt {index}, expected n={n}")
    return groups


def evaluate(
    engine: Generates,
    scorer: Scores,
    problems: list[Problem],
    prompts: list[list[int]],
    *,
    n: int,
    ks: list[int],
    sampling: Sampling,
    samples_path: str | None = None,
    progress: RunProgress | None = None,
) -> dict:
    """Sample `n` completions of each prompt, score them against each problem's answer.

    `prompts[i]` is the tokenised prompt of `problems[i]`. Returns the summarize() dict
    (avg@k, pass@k, maj@k, n_problems, stderr, problems); with `samples_path`, every scored
    sample is also written there as one JSONL row (see rollouts_file). With `progress`,
    generation and scoring each drive an "eval ..." bar.
    """
    ks = check_ks(ks)  # fail before the expensive generate call, not after it
    if n < ks[-1]:
        raise ValueError(f"n={n} samples per problem cannot give @{ks[-1]} metrics; use n >= {ks[-1]}")
    rows = scored_samples(engine, scorer, problems, prompts, n=n, sampling=sampling, progress=progress)
    if samples_path is not None:
        write_samples(samples_path, rows)
    return summarize_rows(rows, ks)


def scored_samples(
    engine: Generates,
    scorer: Scores,
    problems: list[Problem],
    prompts: list[list[int]],
    *,
    n: int,
    sampling: Sampling,
    progress: RunProgress | None = None,
) -> list[SampleRow]:
    """The scored samples `evaluate` summarises: n per problem, in problem order, each with its
    response (a multi-turn trajectory's whole transcript), extracted answer and reward."""
    if len(problems) != len(prompts):
        raise ValueError(f"need one prompt per problem, got {len(problems)} problems and {len(prompts)} prompts")
    if not problems:
        raise ValueError("no problems to evaluate")
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"problem ids must be unique, {duplicate!r} appears more than once")

    generated = engine.generate(prompts, n, sampling, progress=phase(progress, "eval generate", len(prompts) * n))
    groups = _group_by_prompt(generated, len(prompts), n)
    ordered = [(problems[i], sample, rollout) for i, group in enumerate(groups) for sample, rollout in enumerate(group)]
    # an environment that scores its own trajectories (code_tests) has given their rewards already
    verify = [k for k, (_, _, r) in enumerate(ordered) if r.reward is None]
    rows = [ordered[k][0] for k in verify]
    named = [p.meta.get("verifier") for p in rows]  # a row's own verifier (data_source, a built-in set's)
    verified = (
        scorer.score(
            [ordered[k][2].text for k in verify],
            [p.answer for p in rows],
            verifiers=named if any(named) else None,
            progress=phase(progress, "eval score", len(verify)),
        )
        if verify
        else []
    )
    if len(verified) != len(verify):
        raise ValueError(f"scorer returned {len(verified)} scores for {len(verify)} responses")
    scores = [Score(r.reward, "ok") if r.reward is not None else None for _, _, r in ordered]
    for k, score in zip(verify, verified):
        scores[k] = score

    return [
        SampleRow(
            problem_id=problem.id,
            sample=sample,
            response=rollout.transcript or rollout.text,
            extracted=score.extracted,
            reward=score.reward,
            status=score.status,
            answer=problem.answer,
            turns=rollout.turns if rollout.transcript is not None else None,
            tool_calls=rollout.tool_calls if rollout.transcript is not None else None,
        )
        for (problem, sample, rollout), score in zip(ordered, scores)
    ]
