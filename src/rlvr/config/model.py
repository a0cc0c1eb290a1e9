"""The policy's model folder (or the estimate of one not at hand) and its data: problems and prompts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlvr.config.base import Section
from rlvr.data.reasoning_gym import draws_overlap, is_reasoning_gym_spec
from rlvr.data.templates import AUTO, get_template


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
