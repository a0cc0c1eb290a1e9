"""The `demo:` section: the tiny model, the synthetic task and the checked warm start `rlvr demo` builds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlvr.config.base import Section


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
        "(at temperature 1 a tiny model that copies each digit right 93% of the time boxes 5 digits right 70% of the "
        "time, so the bar sits below that and RL takes it further)",
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
