"""The LoRA targets a run trains, as the engine applies them: a plan, a run and a served model
resolve `trainer.lora.target_modules` the same way before anything loads."""

from __future__ import annotations

import torch

from rlvr.config import ModelConfig, TrainerConfig
from rlvr.engines.lora_targets import dropped_line, engine_lora_targets, engine_uses_mla
from rlvr.models.estimate import estimate_config
from rlvr.models.folder import config_file, model_config
from rlvr.models.transformers_classes import causal_lm_from_config
from rlvr.quant.linear import all_linear_names


def with_engine_lora_targets(model: ModelConfig, trainer: TrainerConfig, log=print) -> TrainerConfig:
    """`trainer` with `lora.target_modules` resolved, for `model`, to the modules the engine
    applies in prefill and decode (rlvr.engines.lora_targets): "all-linear" without them, said
    once; an explicit target the engine would not apply is refused."""
    lora = trainer.lora
    if lora is None:
        return trainer
    # the folder as vLLM reads it (a Mistral Large 3 folder: the trainer's mistral4, vLLM's deepseek_v3),
    # or the model model.estimate describes (plans and rehearsals of a model not at hand)
    folder = config_file(model.path).is_file() or model.estimate is None
    config = model_config(model.path) if folder else estimate_config(model.estimate)
    if not engine_uses_mla(model.path if folder else config):
        return trainer
    names = []
    if lora.target_modules == "all-linear":
        with torch.device("meta"):
            names = all_linear_names(causal_lm_from_config(config))
    targets, dropped = engine_lora_targets(lora.target_modules, names, uses_mla=True)
    if dropped:
        log(dropped_line(dropped))
    return trainer.model_copy(update={"lora": lora.model_copy(update={"target_modules": targets})})
