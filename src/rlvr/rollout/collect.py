"""One step's rollouts: draw prompts, generate, score, weigh (advantages), batch for the trainer.

    collector = RolloutCollector(cfg.rollout, cfg.algorithm, cfg.reward, engine, pool, train_set, sampler, ...)
    step_rollouts = collector.collect(step)     # StepRollouts(batch, metrics, data_position)

A step's generation seed is derived from the run's seed and the step, so the same prompts under
the same weights give the same rollouts whenever they are generated (a resumed run, a retry on
a restarted engine, rollouts generated one step ahead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from rlvr.config import AlgorithmConfig, RewardConfig, RolloutConfig, SamplingConfig
from rlvr.records import Rollout, Sampling, Score, TrainBatch
from rlvr.rollout.prompts import PromptSet
from rlvr.rollout.sampler import EpochSampler
from rlvr.tracking.progress import phase
from rlvr.tracking.timing import StepTimer


@dataclass
class StepRollouts:
    """One step's scored rollouts, ready for the trainer."""

    batch: TrainBatch
    metrics: dict[str, float]  # reward/*, response/*, score/*, data/position
    data_position: int  # the prompt sampler's position before this step's prompts were taken


def training_sampling(sampling: SamplingConfig) -> Sampling:
    """The engine's sampling record for training rollouts (each step adds its own seed)."""
    return Sampling(
        temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens, stop=tuple(sampling.stop)
    )


class RolloutCollector:
    """Turns the next prompts of the epoch order into a `StepRollouts`."""

    def __init__(
        self,
        rollout: RolloutConfig,
        algorithm: AlgorithmConfig,
        reward: RewardConfig,
        engine,
        pool,
        train_set: PromptSet,
        sampler: EpochSampler,
        *,
        seed: int,
        timer: StepTimer,
        progress=None,
    ):
        self.rollout, self.algorithm, self.reward = rollout, algorithm, reward
        self.engine, self.pool, self.train_set, self.sampler = engine, pool, train_set, sampler
        self.seed, self.timer, self.progress = seed, timer, progress
        self.sampling = training_sampling(rollout.sampling)

    def collect(self, step: int) -> StepRollouts:
        position = self.sampler.position
        chosen = self.sampler.take(self.rollout.prompts_per_step)
        rollouts, scores = self._generate_and_score(chosen, step)
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
        group = torch.tensor([r.prompt_index for r in rollouts], dtype=torch.long)
        batch = TrainBatch(
            prompt_ids=[r.prompt_ids for r in rollouts],
            completion_ids=[r.completion_ids for r in rollouts],
            sampler_logprobs=[r.logprobs for r in rollouts],
            advantages=self._advantages(rewards, group),
            group=group,
        )
        return StepRollouts(batch, self._metrics(rollouts, scores, rewards), position)

    def _generate_and_score(self, chosen: list[int], step: int) -> tuple[list[Rollout], list[Score]]:
        samples = len(chosen) * self.rollout.samples_per_prompt
        with self.timer("generate"):
            rollouts = self.engine.generate(
                [self.train_set.prompts[i] for i in chosen],
                self.rollout.samples_per_prompt,
                replace(self.sampling, seed=self.seed * 100_003 + step),
                progress=phase(self.progress, "generate", samples),
            )
        with self.timer("score"):
            answers = [self.train_set.problems[chosen[r.prompt_index]].answer for r in rollouts]
            scores = self.pool.score([r.text for r in rollouts], answers, progress=phase(self.progress, "score", samples))
        bad = next((i for i, s in enumerate(scores) if not math.isfinite(s.reward)), None)
        if bad is not None:  # as in eval: a NaN would silently turn the whole group's advantages to NaN
            problem = self.train_set.problems[chosen[rollouts[bad].prompt_index]].id
            raise ValueError(f"reward.verifier={self.reward.verifier}: reward must be a finite number, got "
                             f"{scores[bad].reward!r} (problem {problem!r})")
        return rollouts, scores

    def _advantages(self, rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        from rlvr.algorithms import advantages

        return advantages(self.algorithm.advantage, rewards, group, std_normalize=self.algorithm.std_normalize)

    def _metrics(self, rollouts: list[Rollout], scores: list[Score], rewards: torch.Tensor) -> dict[str, float]:
        lengths = [len(r.completion_ids) for r in rollouts]
        return {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
            "response/length_mean": sum(lengths) / len(lengths),
            "response/length_max": max(lengths),
            "response/truncated_fraction": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
            "score/no_answer_fraction": sum(s.status == "no_answer" for s in scores) / len(scores),
            "data/position": self.sampler.position,
        }
