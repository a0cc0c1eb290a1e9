"""What a plan reads of a run: `PlanSections`, the model, engine, trainer and placement sections,
the model folder's record where there is a folder, and the shape of a step where the run has its
own data.

    sections = PlanSections.of(cfg)     # `rlvr train` (its --dry-run) and the run's builders
    plan = make_plan(sections)

`rlvr serve` builds one from a client's request (rlvr.serve.model.served_sections): a served
model's data is the client's, each sequence at most engine.max_model_len, so its sections have
no step shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlvr.config import (
    AlgorithmConfig,
    EngineConfig,
    EnvConfig,
    ModelConfig,
    PlacementConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
)
from rlvr.models.folder import ModelFolder, config_file, read_model_folder


@dataclass(frozen=True)
class StepShape:
    """What each step of a run samples and trains, as the plan reads it: the longest prompt, the
    rollouts (how many, how long, how far ahead), what a trajectory is, and the loss's terms."""

    max_prompt_tokens: int  # data.max_prompt_tokens
    rollout: RolloutConfig
    env: EnvConfig
    algorithm: AlgorithmConfig


@dataclass(frozen=True)
class PlanSections:
    """The sections a plan reads (rlvr.planning.plan), each whole."""

    model: ModelConfig
    engine: EngineConfig
    trainer: TrainerConfig
    placement: PlacementConfig
    steps: StepShape | None  # None: a served model, whose clients bring their own sequences
    folder: ModelFolder | None = None  # model.path's record; None: no folder there (the plan reads model.estimate)

    @classmethod
    def of(cls, cfg: RunConfig, folder: ModelFolder | None = None) -> PlanSections:
        """`folder`: model.path's record where the caller has read it, else read here if there is one."""
        return cls(
            model=cfg.model,
            engine=cfg.engine,
            trainer=cfg.trainer,
            placement=cfg.placement,
            steps=StepShape(cfg.data.max_prompt_tokens, cfg.rollout, cfg.env, cfg.algorithm),
            folder=folder or folder_at(cfg.model.path),
        )


def folder_at(path: str | Path) -> ModelFolder | None:
    """The record of the model folder at `path`, or None where there is none (a plan of a model not
    at hand, from model.estimate)."""
    return read_model_folder(path) if config_file(path).is_file() else None
