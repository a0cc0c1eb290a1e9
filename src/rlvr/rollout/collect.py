"""One step's rollouts: draw prompts, roll out, score, weigh (advantages), batch for the trainer.

    collector = RolloutCollector(cfg.rollout, cfg.algorithm, cfg.reward, runner, pool, train_set, sampler, ...)
    step_rollouts = collector.collect(step)     # StepRollouts(batch, metrics, data_position)

A step's generation seed is derived from the run's seed and the step, so the same prompts under
the same weights give the same rollouts whenever they are generated (a resumed run, a retry on
a restarted engine, rollouts generated one step ahead).

Fully asynchronous (`rollout.mode: async`), the groups come from a `stream`
(rlvr.rollout.async_groups.AsyncGroups) that draws the prompts itself and keeps the engine
generating across steps; the collector takes the next admitted groups from it and scores,
shapes and batches them as it does its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from rlvr.algorithms import advantages, groups_to_refill, informative_group_mask, overlong_penalty
from rlvr.config import AlgorithmConfig, RewardConfig, RolloutConfig, SamplingConfig
from rlvr.records import Problem, Sampling, Score, TrainBatch
from rlvr.rollout.async_groups import AsyncGroups, Group, staleness_metrics
from rlvr.rollout.prompts import PromptSet
from rlvr.rollout.sampler import EpochSampler
from rlvr.rollout.trajectories import Start, Trajectory, TrajectoryRunner
from rlvr.tracking.progress import phase
from rlvr.tracking.timing import StepTimer


@dataclass
class StepRollouts:
    """One step's scored rollouts, ready for the trainer."""

    batch: TrainBatch
    metrics: dict[str, float]  # reward/*, response/*, score/*, data/position
    data_position: int  # the prompt sampler's position before this step's prompts were taken


def row_verifiers(problems: list[Problem]) -> list[str | None] | None:
    """The verifier each row names (a verl/SkyRL data_source, a built-in set's own), None for the
    pool's (reward.verifier) where it names none; None when no row names one."""
    named = [p.meta.get("verifier") for p in problems]
    return named if any(named) else None


def training_sampling(sampling: SamplingConfig) -> Sampling:
    """The engine's sampling record for training rollouts (each step adds its own seed)."""
    return Sampling(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens,
        stop=tuple(sampling.stop),
    )


@dataclass
class _Group:
    """The scored trajectories of one prompt."""

    problem: int  # index into the prompt set
    trajectories: list[Trajectory]
    scores: list[Score]
    rewards: torch.Tensor  # [n] after any reward shaping
    informative: bool  # rewards not all equal: advantages not all 0 (GRPO, RLOO, Dr. GRPO alike)
    stream: Group | None = None  # fully asynchronous: as the stream handed it out (its token versions)


class RolloutCollector:
    """Turns the next prompts of the epoch order into a `StepRollouts`: each prompt's
    samples_per_prompt trajectories through its environment (single_turn: one completion),
    scored by the environment or, where it leaves the reward to it, the verifier.

    With `rollout.dynamic_sampling` (DAPO, Yu et al. 2025) a group whose rewards are all equal
    has advantage 0 for every member and is dropped; more prompts are drawn, in at most
    `max_sampling_rounds` rounds, until `prompts_per_step` informative groups are found. The
    prompts drawn are consumed either way, so the data position (and a resumed run) stays exact.
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        algorithm: AlgorithmConfig,
        reward: RewardConfig,
        runner: TrajectoryRunner,
        pool,
        train_set: PromptSet,
        sampler: EpochSampler,
        *,
        seed: int,
        timer: StepTimer,
        progress=None,
        log=print,
        stream: AsyncGroups | None = None,
    ):
        self.rollout, self.algorithm, self.reward = rollout, algorithm, reward
        self.runner, self.pool, self.train_set, self.sampler = runner, pool, train_set, sampler
        self.seed, self.timer, self.progress, self.log = seed, timer, progress, log
        self.sampling = training_sampling(rollout.sampling)
        self.stream = stream

    def collect(self, step: int) -> StepRollouts:
        position = self.sampler.position
        first_group = self.stream.handed_out if self.stream is not None else None
        target = self.rollout.prompts_per_step
        sampled: list[_Group] = []
        kept: list[_Group] = []
        dropped_stale = 0
        rounds = self.rollout.max_sampling_rounds if self.rollout.dynamic_sampling else 1
        for round_index in range(rounds):
            missing = groups_to_refill(len(kept), target)
            # later rounds draw as many prompts as the informative rate so far says they need
            draw = missing if not kept else min(target, math.ceil(missing * len(sampled) / len(kept)))
            groups, dropped = self._sample(draw, step, round_index)
            sampled += groups
            dropped_stale += dropped
            kept += [g for g in groups if g.informative or not self.rollout.dynamic_sampling][:missing]
            if len(kept) == target:
                break
        # one round is a choice (drop the uninformative groups, refill none): said only when nothing is left
        if len(kept) < target and (rounds > 1 or not kept):
            found, trained = len(kept), "those"
            if not kept:
                # With none informative every advantage is 0, so the step's gradient is the KL term's
                # alone: without one, a single group gives the same zero gradient as all of them, at a
                # fraction of the train step's cost. The optimizer still steps on it (once, where
                # trainer.mini_batches > 1 would have stepped once per mini-batch).
                kept = groups if self.algorithm.kl_term else groups[:1]
                trained = (
                    "the last round's groups (no gradient but the KL term's)"
                    if self.algorithm.kl_term
                    else "one group of the last round (all advantages 0: no gradient)"
                )
            self.log(
                f"step {step}: dynamic sampling found {found} of {target} informative groups in {rounds} rounds "
                f"({len(sampled)} prompts drawn); training on {trained}; raise rollout.max_sampling_rounds for more"
            )
        metrics = self._metrics(sampled) | {
            "rollout/informative_groups": sum(g.informative for g in kept),
            "rollout/sampled_groups": len(sampled),
            "rollout/sampling_rounds": round_index + 1,
        }
        if self.stream is not None:
            assert first_group is not None  # read from the same stream above
            # staleness against the policy that trains on them: the weights after step - 1's update
            metrics |= staleness_metrics([g.stream for g in sampled if g.stream is not None], step - 1, dropped_stale)
            # every group of [groups_from, groups_to) in draw order was trained, dropped stale or (dynamic
            # sampling) filtered this step: a run that loses or repeats one breaks the chain of ranges
            metrics |= {"rollout/groups_from": first_group, "rollout/groups_to": self.stream.handed_out}
        return StepRollouts(self._batch(kept), metrics, position)

    def _sample(self, count: int, step: int, round_index: int) -> tuple[list[_Group], int]:
        """Roll out and score the trajectories of the next `count` prompts; one group each, rewards
        shaped. Fully asynchronous, the stream's next `count` groups admitted for step's policy,
        and how many it dropped as stale on the way (else 0)."""
        n = self.rollout.samples_per_prompt
        if self.stream is not None:
            with self.timer("generate"):
                batch = self.stream.take(count, version=step - 1)
            taken, dropped = batch.groups, int(batch.metrics["rollout/dropped_stale"])
            chosen = [g.problem for g in taken]
            trajectories = [replace(t, prompt_index=p) for p, g in enumerate(taken) for t in g.trajectories]
        else:
            chosen, taken, dropped = self.sampler.take(count), None, 0
            # the step's (and round's) own seed: the same prompts give the same samples on a retry or a resume
            seed = self.seed * 100_003 + step + round_index * 1_000_000_007
            starts = [Start(self.train_set.problems[i], self.train_set.prompts[i]) for i in chosen]
            with self.timer("generate"):
                trajectories = self.runner.run(
                    starts,
                    n,
                    replace(self.sampling, seed=seed),
                    progress=phase(self.progress, "generate", len(chosen) * n),
                )
        with self.timer("score"):
            scores = self._scores(chosen, trajectories)

        rewards = self._shaped_rewards(trajectories, scores)
        informative = informative_group_mask(rewards, torch.tensor([t.prompt_index for t in trajectories]))
        return [
            _Group(
                chosen[p],
                trajectories[p * n : (p + 1) * n],
                scores[p * n : (p + 1) * n],
                rewards[p * n : (p + 1) * n],
                bool(informative[p * n]),
                taken[p] if taken is not None else None,
            )
            for p in range(len(chosen))
        ], dropped

    def _scores(self, chosen: list[int], trajectories: list[Trajectory]) -> list[Score]:
        """The environment's reward where it gave one, else the verifier's on the last turn (in the pool)."""
        verify = [k for k, t in enumerate(trajectories) if t.reward is None]
        problems = [self.train_set.problems[chosen[trajectories[k].prompt_index]] for k in verify]
        verified = (
            self.pool.score(
                [trajectories[k].text for k in verify],
                [p.answer for p in problems],
                verifiers=row_verifiers(problems),
                progress=phase(self.progress, "score", len(verify)),
            )
            if verify
            else []
        )
        # the verifier's scores, in order, fill the places `verify` lists: where the environment gave none
        verifier_scores = iter(verified)
        scores = [Score(t.reward, "ok") if t.reward is not None else next(verifier_scores) for t in trajectories]
        bad = next((k for k, s in enumerate(scores) if not math.isfinite(s.reward)), None)
        if bad is not None:  # as in eval: a NaN would silently turn the whole group's advantages to NaN
            problem = self.train_set.problems[chosen[trajectories[bad].prompt_index]].id
            raise ValueError(
                f"reward.verifier={self.reward.verifier}: reward must be a finite number, got "
                f"{scores[bad].reward!r} (problem {problem!r})"
            )
        return scores

    def _shaped_rewards(self, trajectories: list[Trajectory], scores: list[Score]) -> torch.Tensor:
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
        shaping = self.algorithm.overlong_penalty
        if shaping is not None:
            lengths = torch.tensor([sum(t.mask) for t in trajectories])
            rewards = rewards + overlong_penalty(
                lengths, max_len=self.rollout.sampling.max_tokens, cache_len=shaping.buffer, factor=shaping.max_penalty
            ).to(rewards.dtype)
        return rewards

    def _batch(self, groups: list[_Group]) -> TrainBatch:
        trajectories = [t for g in groups for t in g.trajectories]
        rewards = torch.cat([g.rewards for g in groups])
        group = torch.tensor([k for k, g in enumerate(groups) for _ in g.trajectories], dtype=torch.long)
        masks = [t.mask for t in trajectories]
        if self.algorithm.overlong_filter:  # a cut-off answer is not wrong: it teaches nothing either way
            masks = [[0] * len(m) if t.finish_reason == "length" else m for t, m in zip(trajectories, masks)]
        # batch whitening (REINFORCE++) weighs each response by the tokens the loss trains on
        trained = torch.tensor([sum(m) for m in masks])
        return TrainBatch(
            prompt_ids=[t.prompt_ids for t in trajectories],
            completion_ids=[t.completion_ids for t in trajectories],
            sampler_logprobs=[t.logprobs for t in trajectories],
            advantages=advantages(
                self.algorithm.advantage, rewards, group, std_normalize=self.algorithm.std_normalize, lengths=trained
            ),
            group=group,
            loss_mask=None if all(all(m) for m in masks) else masks,  # None: every completion token trains
            routes=batch_routes(trajectories),
        )

    def _metrics(self, groups: list[_Group]) -> dict[str, float]:
        """Over every trajectory drawn this step (with dynamic sampling, dropped groups too)."""
        trajectories = [t for g in groups for t in g.trajectories]
        scores = [s for g in groups for s in g.scores]
        rewards = torch.cat([g.rewards for g in groups])
        lengths = [sum(t.mask) for t in trajectories]  # the tokens the model sampled
        count = len(trajectories)
        truncated = sum(t.finish_reason == "length" for t in trajectories) / count
        metrics = {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
            "response/length_mean": sum(lengths) / count,
            "response/length_max": max(lengths),
            "response/length_p50": nearest_rank(lengths, 0.5),
            "response/length_p90": nearest_rank(lengths, 0.9),
            "response/truncated_fraction": truncated,
            "score/no_answer_fraction": sum(s.status == "no_answer" for s in scores) / len(scores),
            "data/position": self.sampler.position,
            "env/turns_mean": sum(t.turns for t in trajectories) / count,
            "env/tool_calls_mean": sum(t.tool_calls for t in trajectories) / count,
            "env/tool_errors_mean": sum(t.tool_errors for t in trajectories) / count,
            "time/env": sum(t.env_seconds for t in trajectories),  # a timing: reruns need not reproduce it
        }
        if self.algorithm.overlong_penalty is not None:
            metrics["reward/verifier_mean"] = sum(s.reward for s in scores) / len(scores)
        if self.algorithm.overlong_filter:
            metrics["response/overlong_filtered_fraction"] = truncated
        return metrics


def batch_routes(trajectories: list[Trajectory]) -> list[torch.Tensor] | None:
    """Each trajectory's MoE routes, where the engine recorded them (for every rollout, or for none)."""
    routes = [t.routes for t in trajectories if t.routes is not None]
    return routes if len(routes) == len(trajectories) else None


def nearest_rank(values: list[int], q: float) -> int:
    """The q-quantile of `values` by the nearest-rank method: the ceil(q·n)-th smallest."""
    return sorted(values)[max(0, math.ceil(q * len(values)) - 1)]
