"""One typed config tree for a run: YAML files plus dotted overrides.

    cfg = load_config("configs/demo.yaml", ["trainer.lr=1e-5", "steps=50"])

Every error (unknown key, bad value, missing file) is raised as `ConfigError` with one line
that names the key, the file and, for a misspelt key, the closest valid one — before
anything starts.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming key and file."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModelSpec(Section):
    """A tiny random causal LM built locally (see rlvr.models.tiny)."""

    arch: str = "qwen2"
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(512, gt=0)
    max_position_embeddings: int = Field(512, gt=0)


class SyntheticTaskSpec(Section):
    """Arithmetic problems with verifiable answers, split by seed into train and test."""

    operations: list[Literal["+", "-", "*"]] = ["+"]
    min_digits: int = Field(1, ge=1)
    max_digits: int = Field(2, ge=1)
    train_size: int = Field(2000, gt=0)
    test_size: int = Field(100, gt=0)


class WarmStartSpec(Section):
    """A short supervised phase that brings a random model to a non-zero starting reward."""

    steps: int = Field(300, ge=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(3e-3, gt=0)
    examples: int = Field(2000, gt=0)


class DemoSpec(Section):
    """What `rlvr demo` builds when missing: the tiny model, the task, the warm start."""

    base_format: Literal["hf", "nvfp4", "nf4"] = Field(
        "nvfp4", description="nvfp4 / nf4: quantize the warm-started model to that 4-bit format"
    )
    model: TinyModelSpec = TinyModelSpec()
    task: SyntheticTaskSpec = SyntheticTaskSpec()
    warm_start: WarmStartSpec = WarmStartSpec()


class ArchitectureEstimate(Section):
    """The numbers `rlvr train --dry-run` estimates memory from when model.path has no
    config.json yet (a dense decoder: Llama, Qwen, Mistral ...); config.json wins when present."""

    hidden_size: int = Field(..., gt=0)
    num_layers: int = Field(..., gt=0)
    num_heads: int = Field(..., gt=0)
    num_kv_heads: int = Field(..., gt=0)
    head_dim: int | None = Field(None, gt=0, description="default hidden_size / num_heads")
    intermediate_size: int = Field(..., gt=0)
    vocab_size: int = Field(..., gt=0)
    tie_word_embeddings: bool = False
    weight_format: Literal["float", "nvfp4"] = Field("float", description="nvfp4: the checkpoint's Linear layers are NVFP4")


class ModelConfig(Section):
    path: str = Field(..., description="HF model folder (or the tiny model the demo builds there)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    estimate: ArchitectureEstimate | None = None


class DataConfig(Section):
    train: str = Field(..., description="built-in set name or a .jsonl/.json/.parquet file")
    test: str | None = None
    problem_field: str | None = None
    answer_field: str | None = None
    template: str = "boxed"
    chat_template: bool = True
    max_prompt_tokens: int = Field(256, gt=0)


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(64, gt=0)
    stop: list[str] = []


class EngineConfig(Section):
    backend: Literal["vllm", "hf"] = "vllm"
    tensor_parallel_size: int = Field(1, ge=1)
    kv_cache_gb: float = Field(1.0, gt=0)
    max_model_len: int = Field(512, gt=0)
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    block_size: int | None = Field(
        None, gt=0, description="KV-cache block in tokens (null: 32 on CPU, so that samples share short prompts; vLLM's on GPU)"
    )
    num_threads: int | None = Field(None, gt=0, description="CPU threads for generation (default: the engine's)")
    sync_check_threshold: float = Field(0.05, gt=0, description="max sync/logprob_gap before the run stops")
    max_restarts: int = Field(2, ge=0, description="times a dead engine is restarted (and its step retried) per run")
    in_process: bool | None = Field(
        None, description="vLLM's engine core inside the controller (null: yes on CPU, a separate process on GPU); "
        "only a separate process can die alone and be restarted"
    )


class RolloutConfig(Section):
    prompts_per_step: int = Field(16, gt=0)
    samples_per_prompt: int = Field(8, gt=0)
    sampling: SamplingConfig = SamplingConfig()
    max_staleness: int = Field(
        0, ge=0, le=1,
        description="0: synchronous; 1: one-step-off-policy (generate step t+1 while step t trains)",
    )


class RewardConfig(Section):
    verifier: str = "math"
    workers: int = Field(2, ge=1)
    timeout_s: float = Field(2.0, gt=0)
    memory_limit_mb: int = Field(1024, gt=0)


class AlgorithmConfig(Section):
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"] = "grpo"
    std_normalize: bool = True
    loss: Literal["ppo", "gspo", "cispo"] = "ppo"
    agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = "token_mean"
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.2, ge=0)
    dual_clip: float | None = None
    kl: Literal["k1", "k2", "k3"] | None = None
    kl_coef: float = Field(0.0, ge=0)
    tis_cap: float | None = Field(
        None, gt=0,
        description="truncated importance sampling, weights min(pi_old / pi_sampler, cap); "
        "null: 2.0 when rollout.max_staleness > 0, else off",
    )
    tis_level: Literal["token", "sequence", "geometric"] = "token"


class LoraConfig(Section):
    rank: int = Field(16, gt=0)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    target_experts: bool = Field(
        False,
        description="MoE: also train a LoRA pair per routed expert (gate/up and down), in peft's target_parameters "
        "layout; attention, MLA and shared experts are covered by target_modules. Needs dropout 0",
    )


class TrainerConfig(Section):
    ranks: int = Field(1, ge=1, description="FSDP2 worker processes")
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(4096, gt=0, description="token budget of one packed micro-batch")
    gradient_checkpointing: bool = False
    attention: Literal["packed", "sdpa"] = Field(
        "packed", description="packed: each packed sequence attends alone; sdpa: transformers' block-diagonal mask"
    )
    share_prompts: bool = Field(
        True, description="with packed attention, a prompt's samples share one copy of it in the forward (exact)"
    )
    lora: LoraConfig | None = None
    max_consecutive_skips: int = Field(
        3, ge=1, description="stop the run after this many steps in a row skipped for a non-finite loss or gradient"
    )


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="eval every N steps (0: only before and after)")
    n: int = Field(8, gt=0)
    k: list[int] = [1, 8]
    temperature: float = Field(1.0, ge=0)
    max_problems: int | None = None

    @model_validator(mode="after")
    def _k_within_n(self) -> EvalConfig:
        bad = [k for k in self.k if k > self.n or k < 1]
        if bad:
            raise ValueError(f"k={bad[0]} must be between 1 and eval.n={self.n}")
        return self


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep: int = Field(2, ge=1)


class TrackingConfig(Section):
    backends: list[Literal["tensorboard", "wandb", "mlflow"]] = []
    progress: bool = True


class PlacementConfig(Section):
    """Where the engine and the trainer ranks run."""

    backend: Literal["local", "ray"] = Field("local", description="local: plain processes; ray: Ray actors")
    ray_address: str | None = Field(None, description="Ray cluster to join ('auto', 'host:port'); None starts a private one, ignoring RAY_ADDRESS")
    colocate: bool = Field(True, description="engine and trainer share devices (the engine sleeps while training)")
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0, description="0: CPU only")
    engine_gpus: int = Field(0, ge=0, description="split placement: GPUs given to the engine(s)")
    gpu_memory_gb: float | None = Field(
        None, gt=0, description="usable memory of one GPU in GB (1e9 bytes); --dry-run checks the estimate against it"
    )


class RunConfig(Section):
    run_dir: str = "runs/default"
    seed: int = 0
    steps: int = Field(100, ge=0)
    model: ModelConfig
    data: DataConfig
    engine: EngineConfig = EngineConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    trainer: TrainerConfig = TrainerConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    tracking: TrackingConfig = TrackingConfig()
    placement: PlacementConfig = PlacementConfig()
    demo: DemoSpec | None = None

    @model_validator(mode="after")
    def _correct_stale_rollouts(self) -> RunConfig:
        # Rollouts one policy version behind need the off-policy correction; written into the
        # config itself so that the run's config.yaml says what ran (Yao et al. use cap 2).
        if self.rollout.max_staleness and self.algorithm.tis_cap is None:
            self.algorithm.tis_cap = 2.0
        return self


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a YAML config, apply `a.b.c=value` overrides, validate; raise ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(raw).__name__}")
    for item in overrides:
        alone: dict = {}
        _apply_override(alone, item)
        _check_keys(alone, RunConfig, prefix="", source=f"override {item!r}")
        _apply_override(raw, item)
    return validate_config(raw, source=str(path))


def validate_config(raw: dict, source: str = "<config>") -> RunConfig:
    _check_keys(raw, RunConfig, prefix="", source=source)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "<root>"
        value = _lookup(raw, first["loc"])
        shown = f" (got {value!r})" if value is not _MISSING else ""
        raise ConfigError(f"{source}: {key}: {first['msg']}{shown}") from None


def _apply_override(raw: dict, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. trainer.lr=1e-5")
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(text) if text else None


def _check_keys(raw: Any, model: type[BaseModel], prefix: str, source: str) -> None:
    """Reject unknown keys, recursively, naming the closest valid one."""
    if not isinstance(raw, dict):
        return
    fields = model.model_fields
    for key, value in raw.items():
        if key not in fields:
            full = f"{prefix}{key}"
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"{source}: unknown key {full!r}{hint}")
        sub = _section_type(fields[key].annotation)
        if sub is not None:
            _check_keys(value, sub, prefix=f"{prefix}{key}.", source=source)


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


_MISSING = object()


def _lookup(raw: Any, loc: tuple) -> Any:
    node = raw
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return _MISSING
    return node


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
