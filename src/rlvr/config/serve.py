"""`rlvr serve`'s config: the Tinker API over the same engine and trainer sections as a run."""

from __future__ import annotations

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from rlvr.config.base import Section
from rlvr.config.rollout import EngineConfig
from rlvr.config.trainer import TrainerConfig

# The tinker SDK refuses to send a key that does not start with this (tinker/lib/_auth_token_provider.py).
SDK_KEY_PREFIX = "tml-"


class LimitsConfig(Section):
    """What one tenant may hold at once. Over a limit, a request is refused with 429 (413 for a body)
    naming the limit; what the tenant already has is kept."""

    models: int = Field(2, ge=1, description="training models a tenant may have created and not yet closed")
    queued_requests: int = Field(
        64, ge=1, description="a tenant's requests accepted and not yet answered (training, saving, sampling)"
    )
    body_bytes: int = Field(
        16_000_000, ge=1024, description="largest request body, in bytes (a forward_backward batch is the largest)"
    )
    sampling_tokens: int = Field(
        262_144,
        ge=1,
        description="tokens a tenant's unanswered sampling calls may cover: num_samples x (prompt + max_tokens), "
        "summed over its calls in flight",
    )


class TenantConfig(Section):
    """One tenant: the keys its clients send as X-API-Key, and optionally its own limits."""

    model_config = ConfigDict(**Section.model_config, hide_input_in_errors=True)  # a key in an error is given away

    api_keys: list[SecretStr] = Field([], description="the tenant's keys (each starts with tml-, as the SDK requires)")
    api_keys_file: str | None = Field(
        None, description="a file of the tenant's keys, one per line (# comments and blank lines skipped)"
    )
    limits: LimitsConfig | None = Field(None, description="this tenant's limits (null: the server's `limits`)")

    @field_validator("api_keys")
    @classmethod
    def _keys_have_the_sdk_prefix(cls, keys: list[SecretStr]) -> list[SecretStr]:
        for number, key in enumerate(keys, 1):
            if not key.get_secret_value().startswith(SDK_KEY_PREFIX):
                raise ValueError(f"key {number} must start with {SDK_KEY_PREFIX!r}: the tinker SDK sends no other key")
        return keys

    @model_validator(mode="after")
    def _some_key(self) -> TenantConfig:
        if not self.api_keys and self.api_keys_file is None:
            raise ValueError("give api_keys or api_keys_file")
        return self


class ServeConfig(Section):
    """`rlvr serve --config FILE.yaml`: the Tinker API over a run's trainer and engine (the same sections and
    defaults). Each create_model request names a base from `models` and its LoRA rank."""

    # pydantic renders a tenant's errors with this config: without this, the rejected key is in the message
    model_config = ConfigDict(**Section.model_config, hide_input_in_errors=True)

    host: str = Field("127.0.0.1", description="address the server listens on (--host wins)")
    port: int = Field(8000, ge=1, le=65535, description="TCP port (--port wins)")
    seed: int = Field(
        0,
        description="seeds LoRA initialisation (unless the request gives one) and the engine's sampling; models "
        "whose base, LoRA rank and seed agree share one engine and one set of trainer ranks",
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
    log_file: str = Field(
        "serve.log",
        description="where the libraries' own output goes (vLLM, transformers, torch, the trainer ranks); "
        "the server's own lines stay on the terminal (--verbose: everything there)",
    )
    checkpoint_dir: str = Field(
        "serve_checkpoints",
        description="folder of save_state's named checkpoints: MODEL_ID/NAME/adapter (PEFT) and "
        "trainer (adapter and optimizer state, as a run's checkpoints hold them)",
    )
    models: dict[str, str] = Field(
        {},
        description="the catalog: the name a client gives as base_model -> the model folder on this machine. "
        "Clients choose only among these names; the SDK loads its tokenizer by the name, so name a model as its "
        "hub id (or by its folder's path where clients share this machine and have no hub)",
    )
    tenants: dict[str, TenantConfig] = Field(
        {},
        description="tenant name -> its API keys. Each tenant sees only what it created. Empty: no keys asked, "
        "one tenant, and the server listens on a loopback address only",
    )
    limits: LimitsConfig = Field(LimitsConfig(), description="each tenant's limits, unless the tenant sets its own")
    engine: EngineConfig = Field(EngineConfig(), description="the engine that samples")
    max_loras: int = Field(
        4,
        ge=1,
        description="adapters of one base its engine holds at once, each in its own slot of vLLM's LoRA layers (vLLM's "
        "max_loras and max_cpu_loras), so that the sampling calls of up to this many models on that base run in one "
        "batch; a further adapter takes the slot of the least recently used. Unused where adapters are merged into "
        "the base (engine.merge_lora, the default on CPU): the engine serves one at a time",
    )
    trainer: TrainerConfig = Field(TrainerConfig(), description="trainer ranks; trainer.lora's rank is the request's")


def catalog_entry(text: str) -> tuple[str, str]:
    """`rlvr serve --model NAME=FOLDER` as (name, folder); a FOLDER alone is named by its path."""
    name, _, folder = text.rpartition("=")
    return (name, folder) if name else (text, text)
