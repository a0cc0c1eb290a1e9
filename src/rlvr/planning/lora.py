"""The LoRA targets a run trains, as the engine applies them: a plan, a run and a served model
resolve `trainer.lora.target_modules` the same way before anything loads."""

from __future__ import annotations

import torch

from rlvr.config import ModelConfig, TrainerConfig
from rlvr.engines.lora_targets import dropped_line, engine_lora_targets, engine_uses_mla
from rlvr.models.estimate import estimate_config
from rlvr.models.folder import ModelFolder, read_model_folder
from rlvr.models.transformers_classes import causal_lm_from_config
from rlvr.planning.sections import folder_at
from rlvr.quant.linear import all_linear_names


def with_engine_lora_targets(
    model: ModelConfig, trainer: TrainerConfig, folder: ModelFolder | None = None, log=print
) -> TrainerConfig:
    """`trainer` with `lora.target_modules` resolved, for `model`, to the modules the engine
    applies in prefill and decode (rlvr.engines.lora_targets): "all-linear" without them, said
    once; an explicit target the engine would not apply is refused. `folder`: model.path's record
    where the caller has read it."""
    lora = trainer.lora
    if lora is None:
        return trainer
    # the folder as vLLM reads it (a Mistral Large 3 folder: the trainer's mistral4, vLLM's deepseek_v3),
    # or the model model.estimate describes (plans and rehearsals of a model not at hand)
    if folder is None:
        folder = folder_at(model.path) if model.estimate is not None else read_model_folder(model.path)
    config = folder.transformers_config() if folder is not None else estimate_config(model.estimate)
    if not engine_uses_mla(model.path if folder is not None else config):
        return trainer
    names = []
    if lora.target_modules == "all-linear":
        with torch.device("meta"):
            names = all_linear_names(causal_lm_from_config(config))
    targets, dropped = engine_lora_targets(lora.target_modules, names, uses_mla=True)
    if dropped:
        log(dropped_line(dropped))
    return trainer.model_copy(update={"lora": lora.model_copy(update={"target_modules": targets})})
