"""The commands a controller sends its trainer ranks, one typed record each, and nothing else:
a rank answers each with what its method returns (rlvr.training.worker, `Rank.handle`), over a
pipe (rlvr.training.wire) or a Ray actor call alike.

    Train(StepInput)   -> TrainReport             Logprobs(micro_batches, temperature) -> {i: logprobs}
    SumLossInput       -> ForwardBackwardReport   OptimStep(lr, betas, ...) -> OptimizerUpdate
    Adapter / FullWeights / LoraConfigOf / Placement / PackedBaseBytes: what the rank holds
    Save(folder) / Load(folder, optimizer) / Close
    AdapterSlot(name, forget): which of many LoRA adapters the rank trains (rlvr.training.adapter_slots)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.training.packing import MicroBatch


@dataclass
class MiniBatch:
    """One optimizer update's share of this rank: its micro-batches, and the update's loss denominators."""

    micro_batches: list[MicroBatch]
    num_tokens: int  # trained tokens of the whole mini-batch, all ranks: the token_mean denominator
    num_sequences: int  # likewise, the seq_mean denominator


@dataclass
class StepInput:
    """One rank's share of a training step: `epochs` passes over its mini-batches, one update each."""

    mini_batches: list[MiniBatch]
    epochs: int
    advantages: dict[int, float]  # sequence index -> advantage
    sampler_logprobs: dict[int, list[float]]
    loss_masks: dict[int, list[int]] | None  # sequence index -> per-token 0/1; None: train on every token
    max_len: int
    temperature: float
    routes: dict[int, torch.Tensor] | None = None  # MoE: sequence index -> the engine's routes; None: none recorded


@dataclass
class SumLossInput:
    """One rank's share of a forward_backward call (the Tinker API's): a loss summed over tokens
    (rlvr.algorithms.sum_losses), its gradient added to the parameters' until optim_step."""

    micro_batches: list[MicroBatch]
    loss: str
    inputs: dict[int, dict[str, torch.Tensor]]  # sequence index -> the loss's per-token inputs, by name
    clip_thresholds: tuple[float, float]
    backward: bool  # False: forward only (logprobs and loss, no gradient)


@dataclass(frozen=True)
class Logprobs:
    """The policy's logprob of every scored token of the micro-batches (no gradient)."""

    micro_batches: list[MicroBatch]
    temperature: float


@dataclass(frozen=True)
class OptimStep:
    """Apply the gradient forward_backward calls accumulated, with these AdamW settings (then clear it)."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    max_grad_norm: float  # inf: no clipping


@dataclass(frozen=True)
class Adapter:
    """This rank's part of the LoRA tensors, in PEFT naming."""


@dataclass(frozen=True)
class FullWeights:
    """The whole model's weights (full fine-tuning), under the HF names; rank 0's answer holds them."""


@dataclass(frozen=True)
class LoraConfigOf:
    """The adapter's PEFT config."""


@dataclass(frozen=True)
class Placement:
    """Where the rank's threads may run, and its torch threads."""


@dataclass(frozen=True)
class PackedBaseBytes:
    """Bytes of packed base weights the rank holds between steps."""


@dataclass(frozen=True)
class Save:
    folder: str


@dataclass(frozen=True)
class Load:
    folder: str
    optimizer: bool = True  # False: the trainable weights alone, a fresh optimizer


@dataclass(frozen=True)
class AdapterSlot:
    """Train, read and save the adapter `name` from now on (a new name starts as the rank started);
    with `forget`, free its state instead (its model closed)."""

    name: str
    forget: bool = False


@dataclass(frozen=True)
class Close:
    """Leave the process group and exit."""


Command = (
    StepInput
    | SumLossInput
    | Logprobs
    | OptimStep
    | Adapter
    | FullWeights
    | LoraConfigOf
    | Placement
    | PackedBaseBytes
    | Save
    | Load
    | AdapterSlot
    | Close
)
