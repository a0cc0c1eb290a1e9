"""`rlvr serve`'s config: the Tinker API over the same engine and trainer sections as a run."""

from __future__ import annotations

from pydantic import Field

from rlvr.config.base import Section
from rlvr.config.rollout import EngineConfig
from rlvr.config.trainer import TrainerConfig


class ServeConfig(Section):
    """`rlvr serve FILE.yaml`: the Tinker API over a run's trainer and engine (the same sections and defaults).
    The base model and the LoRA rank come with each create_model request."""

    host: str = Field("127.0.0.1", description="address the server listens on (--host wins)")
    port: int = Field(8000, ge=1, le=65535, description="TCP port (--port wins)")
    seed: int = Field(
        0, description="seeds LoRA initialisation (unless the request gives one) and the engine's sampling"
    )
    session_timeout_s: float = Field(
        120.0,
        gt=10,
        description="a session not heard from for this long (heartbeat, or a call on its model) ends and "
        "its model is closed; the SDK heartbeats every 10 s",
    )
    log_every_s: float = Field(
        60.0,
        gt=0,
        description="seconds between request-log lines: one line per request kind with its count, not one per request",
    )
    memory_gb: float | None = Field(
        None,
        gt=0,
        description="memory the served models may hold together, by the plan's estimate of each (`rlvr plan`: "
        "engine weights and KV cache, trainer shards, LoRA, optimizer, activations, logits); a create_model that would pass it is "
        "refused before anything loads. null: the RAM this machine has available when the server starts, or its GPUs' "
        "memory where it has GPUs",
    )
    checkpoint_dir: str = Field(
        "serve_checkpoints",
        description="folder of save_state's named checkpoints: MODEL_ID/NAME/adapter (PEFT) and "
        "trainer (adapter and optimizer state, as a run's checkpoints hold them)",
    )
    engine: EngineConfig = Field(EngineConfig(), description="the engine that samples")
    trainer: TrainerConfig = Field(TrainerConfig(), description="trainer ranks; trainer.lora's rank is the request's")
