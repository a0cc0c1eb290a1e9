"""The HF folder's tensors as one tensor-parallel rank's Megatron parameters: each rank reads the
rows it holds of a row-split tensor (column-parallel layers, embeddings), and its columns of a
column-split one (row-parallel layers: the whole tensor passes through, one at a time).

Megatron fuses q, k and v into one `linear_qkv`, grouped by key/value head: for each of the
rank's groups, that group's query heads, then its key, then its value. It fuses the MLP's gate
and up projections into `linear_fc1`: the rank's gate rows, then its up rows."""

from __future__ import annotations

import torch
from torch import nn

from rlvr.models.checkpoint_files import CheckpointFiles, check_shape
from rlvr.training.megatron.gpt import DenseShape


def qkv_interleaved(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int) -> torch.Tensor:
    """One rank's rows of q, k and v (its `groups` key/value heads and their query heads) in
    linear_qkv's order; any trailing dimensions (a weight's input columns) ride along."""
    q, k, v = (x.reshape(groups, -1, *x.shape[1:]) for x in (q, k, v))
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


class RankWeights:
    """Reads one tensor-parallel rank's part of each Megatron parameter from the HF files."""

    def __init__(self, files: CheckpointFiles, shape: DenseShape, rank: int, ranks: int):
        self.files, self.shape, self.rank, self.ranks = files, shape, rank, ranks

    def rows(self, name: str, total: int) -> torch.Tensor:
        """This rank's share of dim 0 (`total` long) of the stored tensor `name`."""
        share = total // self.ranks
        return self.files.read(name, slice(self.rank * share, (self.rank + 1) * share))

    def columns(self, name: str) -> torch.Tensor:
        whole = self.files.read(name)
        share = whole.shape[1] // self.ranks
        return whole[:, self.rank * share : (self.rank + 1) * share]

    def attention_qkv(self, prefix: str, part: str) -> torch.Tensor:
        s = self.shape
        q = self.rows(f"{prefix}.q_proj.{part}", s.heads * s.head_dim)
        k, v = (self.rows(f"{prefix}.{p}_proj.{part}", s.groups * s.head_dim) for p in "kv")
        return qkv_interleaved(q, k, v, s.groups // self.ranks)

    def tensor(self, name: str) -> torch.Tensor:
        """The rank's part of Megatron parameter `name`."""
        s, parts = self.shape, name.split(".")
        if name == "embedding.word_embeddings.weight":
            return self.rows("model.embed_tokens.weight", s.vocab_size)
        if name == "output_layer.weight":
            return self.rows("lm_head.weight", s.vocab_size)
        if name == "decoder.final_layernorm.weight":
            return self.files.read("model.norm.weight")
        layer, rest = f"model.layers.{parts[2]}", ".".join(parts[3:])
        if rest == "input_layernorm.weight":
            return self.files.read(f"{layer}.input_layernorm.weight")
        if rest == "pre_mlp_layernorm.weight":
            return self.files.read(f"{layer}.post_attention_layernorm.weight")
        if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
            return self.attention_qkv(f"{layer}.self_attn", parts[-1])
        if rest == "self_attention.linear_proj.weight":
            return self.columns(f"{layer}.self_attn.o_proj.weight")
        if rest == "mlp.linear_fc1.weight":
            gate, up = (self.rows(f"{layer}.mlp.{p}_proj.weight", s.ffn_size) for p in ("gate", "up"))
            return torch.cat([gate, up])
        if rest == "mlp.linear_fc2.weight":
            return self.columns(f"{layer}.mlp.down_proj.weight")
        raise KeyError(f"{name}: no HF tensor converts to this Megatron parameter")


def load_rank(model: nn.Module, files: CheckpointFiles, shape: DenseShape, rank: int, ranks: int) -> None:
    """Fill every parameter of `model` (this rank's part) from the folder."""
    weights = RankWeights(files, shape, rank, ranks)
    with torch.no_grad():
        for name, param in model.named_parameters():
            tensor = weights.tensor(name)
            check_shape(f"Megatron {name} from the HF folder", tensor, tuple(param.shape))
            param.copy_(tensor)
