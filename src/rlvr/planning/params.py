"""One parameter of the trainer's module tree as the planners split it, and the units FSDP2
gathers together (rlvr.planning.architecture lists them; rlvr.planning.rank_memory splits them).

Each tensor also says how Megatron's layout splits it (megatron-core's TransformerEngine spec,
the one that builds MLA and MoE on GPUs): tensor parallel cuts a column-parallel Linear's output
rows (q/k/v, MLA's q_b and kv_b, gate/up, the vocabulary of embeddings and LM head) and a
row-parallel one's input columns (o, down); MLA's q_a and kv_a projections are duplicated on
every rank; norms and the router are whole on every rank. Expert parallel divides the routed
experts (dim 0), whose own matrices tensor parallel splits as an MLP's (megatron-core's expert
tensor parallel size defaults to tensor_parallel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# which axis of a ParamShape Megatron's tensor (or expert) parallel splits: its rows (dim 0) or
# each row's elements
TensorSplit = Literal["rows", "row_elements"] | None

# a Linear by its HF name: column-parallel (output rows split), row-parallel (input columns), or whole
LINEAR_SPLIT: dict[str, Literal["column", "row"] | None] = {
    "q_proj": "column",
    "k_proj": "column",
    "v_proj": "column",
    "o_proj": "row",
    "q_a_proj": None,
    "q_b_proj": "column",
    "kv_a_proj_with_mqa": None,
    "kv_b_proj": "column",
    "gate_proj": "column",
    "up_proj": "column",
    "down_proj": "row",
}


@dataclass(frozen=True)
class ParamShape:
    """One parameter as FSDP2 shards it: `rows` along dim 0, each of `row_elements` values of
    `element_bytes` bytes (9/16 for an NVFP4 weight: its packed values and FP8 scales); how
    Megatron splits it: `tensor_split`, `experts` (dim 0 counts routed experts), and for the
    root's tensors the pipeline `stage` that holds them (blocks go by layer)."""

    rows: int
    row_elements: int
    element_bytes: float
    trainable: bool = False
    tensor_split: TensorSplit = None
    experts: TensorSplit = None
    stage: Literal["first", "last"] | None = None

    @property
    def numel(self) -> int:
        return self.rows * self.row_elements

    @property
    def bytes(self) -> float:
        return self.numel * self.element_bytes

    def gathered_bytes(self, dtype_bytes: int) -> float:
        """Unsharded, as FSDP2 all-gathers it: trainable tensors cast to the model's dtype (the
        MixedPrecisionPolicy's param_dtype: LoRA's float32 travels as bf16), frozen ones as stored."""
        return self.numel * (dtype_bytes if self.trainable else self.element_bytes)


@dataclass(frozen=True)
class Unit:
    """Parameters FSDP2 gathers together: a decoder block (`count` alike) or the root."""

    name: str
    count: int
    params: tuple[ParamShape, ...]

    @property
    def is_block(self) -> bool:
        return self.name != "root"

    def gathered_bytes(self, dtype_bytes: int) -> float:
        return sum(p.gathered_bytes(dtype_bytes) for p in self.params)
