"""One RL run: every section from the model to placement, and the checks that span sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlvr.config.algorithm import AlgorithmConfig
from rlvr.config.base import Section
from rlvr.config.demo import DemoSpec
from rlvr.config.model import DataConfig, ModelConfig
from rlvr.config.rollout import EngineConfig, EnvConfig, RolloutConfig
from rlvr.config.scoring import RewardConfig, SandboxConfig
from rlvr.config.trainer import TrainerConfig


class EvalConfig(Section):
    """Held-out evaluation of data.test: avg@k, unbiased pass@k, maj@k."""

    every: int = Field(0, ge=0, description="eval every N steps (0: only before and after)")
    n: int = Field(8, gt=0, description="samples per problem")
    k: list[int] = Field([1, 8], description="the k of avg@k, pass@k and maj@k")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of the evaluation")
    max_problems: int | None = Field(None, description="evaluate only the first N problems of data.test (null: all)")

    @model_validator(mode="after")
    def _k_within_n(self) -> EvalConfig:
        bad = [k for k in self.k if k > self.n or k < 1]
        if bad:
            raise ValueError(f"k={bad[0]} must be between 1 and eval.n={self.n}")
        return self


class CheckpointConfig(Section):
    """Atomic checkpoints under run_dir/checkpoints (rlvr.checkpoint.store)."""

    every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep: int = Field(2, ge=1, description="newest checkpoints kept; older ones are deleted")


class TrackingConfig(Section):
    """Where metrics go besides run_dir/metrics.jsonl."""

    backends: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        [], description="experiment trackers to log to as well"
    )
    progress: bool = Field(True, description="progress bars in a terminal")


class PlacementConfig(Section):
    """Where the engine and the trainer ranks run."""

    backend: Literal["local", "ray"] = Field("local", description="local: plain processes; ray: Ray actors")
    ray_address: str | None = Field(
        None, description="Ray cluster to join ('auto', 'host:port'); None starts a private one, ignoring RAY_ADDRESS"
    )
    colocate: bool = Field(True, description="engine and trainer share devices (the engine sleeps while training)")
    nodes: int = Field(1, ge=1, description="machines in the cluster")
    gpus_per_node: int = Field(0, ge=0, description="0: CPU only")
    engine_gpus: int = Field(
        0, ge=0, description="split placement: GPUs given to the engines, engine.replicas x tensor_parallel_size"
    )
    gpu_memory_gb: float | None = Field(
        None, gt=0, description="usable memory of one GPU in GB (1e9 bytes); --dry-run checks the estimate against it"
    )
    gpu: Literal["gb200", "b200", "h200", "h100", "a100"] | None = Field(
        None,
        description="the GPU kind: --dry-run times each phase of a step at its nominal peaks "
        "(rlvr.planning.accelerators) and says which side waits (null: phases not timed; without GPUs "
        "they are timed at this CPU's rates, measured once: rlvr.hardware.cpu_rates)",
    )
    host_memory_gb: float | None = Field(
        None,
        gt=0,
        description="usable host (CPU) memory of one node in GB (1e9 bytes); --dry-run checks what the "
        "node's processes hold while they load the base against it, and on a CPU-only machine what the run's processes "
        "hold while it trains",
    )
    engine_cpus: int | None = Field(
        None,
        ge=1,
        description="split placement on one CPU machine (colocate: false, no GPUs): the engine, with the "
        "controller that runs it, gets the first N cores this run may use and the trainer ranks the rest (a share each "
        "where they divide them), a thread per core (rlvr.planning.cpu_split); `--dry-run` shows the split. null: "
        "every process may run on every core",
    )

    @field_validator("engine_cpus")
    @classmethod
    def _engine_cpus_split_one_cpu_machine(cls, value: int | None, info) -> int | None:
        if value is None:
            return value
        if info.data.get("colocate"):
            raise ValueError("gives the engine cores of its own, a split placement: it needs placement.colocate: false")
        if info.data.get("gpus_per_node"):
            raise ValueError("splits a CPU machine's cores; with GPUs the split is placement.engine_gpus")
        if info.data.get("backend") == "ray":
            raise ValueError(
                "splits the cores of the local backend's processes; on Ray, actors take CPUs as Ray "
                "places them (placement.backend: local)"
            )
        return value


class RunConfig(Section):
    """One RL run: the model, its data, and every stage from rollouts to checkpoints."""

    run_dir: str = Field("runs/default", description="folder for config.yaml, metrics.jsonl, eval samples, checkpoints")
    seed: int = Field(0, description="seeds sampling, data order and initialisation; the same seed reruns the same run")
    steps: int = Field(100, ge=0, description="RL steps")
    model: ModelConfig = Field(..., description="the policy's model folder")
    data: DataConfig = Field(..., description="training and held-out problems, and their prompts")
    engine: EngineConfig = Field(EngineConfig(), description="the rollout engine")
    rollout: RolloutConfig = Field(RolloutConfig(), description="what each step samples")
    env: EnvConfig = Field(EnvConfig(), description="what a trajectory is: single turn, or turns with tools")
    sandbox: SandboxConfig = Field(
        SandboxConfig(), description="isolation and limits for model-written code (tools, code tests)"
    )
    reward: RewardConfig = Field(RewardConfig(), description="how samples are scored")
    algorithm: AlgorithmConfig = Field(AlgorithmConfig(), description="advantages and policy loss")
    trainer: TrainerConfig = Field(TrainerConfig(), description="trainer ranks and optimizer")
    eval: EvalConfig = Field(EvalConfig(), description="held-out evaluation")
    checkpoint: CheckpointConfig = Field(CheckpointConfig(), description="checkpoints and resume")
    tracking: TrackingConfig = Field(TrackingConfig(), description="metrics and progress")
    placement: PlacementConfig = Field(PlacementConfig(), description="processes, devices, Ray")
    demo: DemoSpec | None = Field(None, description="what `rlvr demo` builds before training (null: nothing)")

    @model_validator(mode="after")
    def _mini_batches_of_whole_groups(self) -> RunConfig:
        if self.trainer.mini_batches > self.rollout.prompts_per_step:
            raise ValueError(
                f"trainer.mini_batches={self.trainer.mini_batches} cannot exceed rollout.prompts_per_step="
                f"{self.rollout.prompts_per_step}: a mini-batch holds whole prompt groups"
            )
        if (
            self.algorithm.overlong_penalty
            and self.algorithm.overlong_penalty.buffer > self.rollout.sampling.max_tokens
        ):
            raise ValueError(
                f"algorithm.overlong_penalty.buffer={self.algorithm.overlong_penalty.buffer} exceeds "
                f"rollout.sampling.max_tokens={self.rollout.sampling.max_tokens}"
            )
        return self

    @model_validator(mode="after")
    def _megatron_parallelism_this_machine_runs(self) -> RunConfig:
        # megatron-core's pipeline schedules and sequence-parallel collectives are CUDA-only
        layout = self.trainer.megatron
        if self.trainer.backend == "megatron" and not self.placement.gpus_per_node:
            if layout.pipeline_parallel > 1:
                raise ValueError(
                    f"trainer.megatron.pipeline_parallel={layout.pipeline_parallel} needs GPUs "
                    "(placement.gpus_per_node): megatron-core's pipeline schedules run on CUDA only"
                )
            if layout.sequence_parallel:
                raise ValueError(
                    "trainer.megatron.sequence_parallel needs GPUs (placement.gpus_per_node): megatron-core's "
                    "sequence-parallel collectives run on CUDA only"
                )
        return self

    @model_validator(mode="after")
    def _correct_stale_rollouts(self) -> RunConfig:
        # Rollouts one policy version behind need the off-policy correction; written into the
        # config itself so that the run's config.yaml says what ran (Yao et al. use cap 2).
        if self.algorithm.masked_is and self.algorithm.tis_cap is not None:
            raise ValueError(
                f"algorithm.tis_cap={self.algorithm.tis_cap} and algorithm.masked_is both set the "
                "importance weights: choose one (algorithm.tis_cap: null)"
            )
        if self.rollout.mode != "sync" and self.algorithm.tis_cap is None and self.algorithm.masked_is is None:
            self.algorithm.tis_cap = 2.0
        return self

    @model_validator(mode="after")
    def _async_streams_from_one_engine(self) -> RunConfig:
        # What rlvr.rollout.async_groups drives: one engine taking each policy in flight
        if self.rollout.mode != "async":
            return self
        if self.engine.replicas > 1:
            raise ValueError(
                f"rollout.mode=async streams from one engine; engine.replicas={self.engine.replicas} runs "
                "mode: sync or one_step_off"
            )
        return self
