"""The trainer ranks, their optimizer and the LoRA adapter."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlvr.config.base import Section


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
        "layout; attention, MLA and shared experts are covered by target_modules. Needs dropout 0; with backend: "
        "megatron each expert-parallel rank trains its own experts' pairs",
    )


class MegatronConfig(Section):
    """How trainer.backend=megatron lays the model over the ranks (megatron-core's parallel sizes); the
    ranks left over, trainer.ranks / (tensor x pipeline), each hold a data-parallel replica."""

    tensor_parallel: int = Field(
        1, ge=1, description="ranks each attention and MLP matrix is split over, by heads and hidden columns"
    )
    expert_parallel: int = Field(
        1, ge=1, description="MoE: ranks the routed experts are divided between, each rank holding its own experts"
    )
    pipeline_parallel: int = Field(
        1,
        ge=1,
        description="stages the decoder blocks are cut into: planned by --dry-run and rlvr rehearse; a run refuses "
        "more than 1 (the Megatron rank builds no stages yet)",
    )
    sequence_parallel: bool = Field(
        False,
        description="split the norms' and dropouts' tokens over the tensor-parallel ranks too (tensor_parallel > 1): "
        "planned by --dry-run and rlvr rehearse; a run refuses it (the Megatron rank does not split tokens yet)",
    )

    @model_validator(mode="after")
    def _sequence_parallel_over_tensor_ranks(self) -> MegatronConfig:
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise ValueError(
                "sequence_parallel splits tokens over the tensor-parallel ranks: it needs tensor_parallel > 1"
            )
        return self


class TrainerConfig(Section):
    """The trainer ranks and their optimizer."""

    backend: Literal["fsdp2", "megatron"] = Field(
        "fsdp2",
        description="fsdp2: each rank holds a shard of every parameter and gathers each block for its forward "
        "(torch's fully_shard on the HF model); megatron: megatron-core's GPTModel, each matrix split by tensor "
        "parallel and the routed experts by expert parallel (trainer.megatron), converted from the HF folder",
    )
    megatron: MegatronConfig = Field(
        MegatronConfig(), description="parallel sizes for trainer.backend=megatron (read only by that backend)"
    )
    ranks: int = Field(1, ge=1, description="trainer worker processes")
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

    @model_validator(mode="after")
    def _megatron_layout_fits(self) -> TrainerConfig:
        layout = self.megatron
        if self.backend != "megatron":
            if layout != MegatronConfig():
                raise ValueError("megatron's parallel sizes are read only with backend: megatron")
            return self
        if self.shard_ranks is not None:
            raise ValueError("shard_ranks is FSDP2's sharding; with backend: megatron the layout is trainer.megatron")
        model_parallel = layout.tensor_parallel * layout.expert_parallel * layout.pipeline_parallel
        if self.ranks % model_parallel:
            raise ValueError(
                f"megatron's tensor_parallel x expert_parallel x pipeline_parallel = {model_parallel} must divide "
                f"ranks={self.ranks}"
            )
        if self.lora is None:
            raise ValueError("backend: megatron trains a LoRA adapter (set lora); full fine-tuning is backend: fsdp2's")
        if self.lora.dropout:
            raise ValueError(
                "lora.dropout must be 0 with backend: megatron: each tensor-parallel rank would drop its own "
                "inputs of the factors it shares"
            )
        return self
