"""The HF folder's tensors as one rank's Megatron parameters: each rank reads the rows it holds
of a row-split tensor (column-parallel layers, embeddings), and its columns of a column-split one
(row-parallel layers: the whole tensor passes through, one at a time), and of the routed experts
its own (expert parallel).

Megatron fuses q, k and v into one `linear_qkv`, grouped by key/value head: for each of the
rank's groups, that group's query heads, then its key, then its value. It fuses the MLP's gate
and up projections into `linear_fc1` (a dense MLP's, a shared or routed expert's): the rank's
gate rows, then its up rows. MLA's projections keep transformers' rows as they are: the rotary
dimensions stay interleaved, as megatron-core's MLA reads them (rlvr.training.megatron.mla)."""

from __future__ import annotations

import torch
from torch import nn

from rlvr.models.checkpoint_files import CheckpointFiles, check_shape
from rlvr.training.megatron.gpt import DenseShape
from rlvr.training.megatron.mla import LatentShape

# Megatron parameter (after `decoder.layers.N.`) -> the HF tensor (after `model.layers.N.`) whose
# rows it takes as they are: MLA's projections, norms and router
LATENT_ROWS = {
    "self_attention.linear_q_proj.weight": "self_attn.q_proj.weight",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
}
WHOLE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_a_layernorm.weight",
    "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias",
}


def qkv_interleaved(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int) -> torch.Tensor:
    """One rank's rows of q, k and v (its `groups` key/value heads and their query heads) in
    linear_qkv's order; any trailing dimensions (a weight's input columns) ride along."""
    q, k, v = (x.reshape(groups, -1, *x.shape[1:]) for x in (q, k, v))
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


class RankWeights:
    """Reads one rank's part of each Megatron parameter from the HF files: `rank` of `ranks` tensor
    parallel, `expert_rank` of `expert_ranks` expert parallel."""

    def __init__(
        self,
        files: CheckpointFiles,
        shape: DenseShape | LatentShape,
        rank: int,
        ranks: int,
        expert_rank: int = 0,
        expert_ranks: int = 1,
    ):
        self.files, self.shape, self.rank, self.ranks = files, shape, rank, ranks
        self.expert_rank, self.expert_ranks = expert_rank, expert_ranks

    def rows(self, name: str, total: int | None = None) -> torch.Tensor:
        """This rank's share of dim 0 (`total` long; None: as stored) of the stored tensor `name`."""
        share = (total or self.files.meta(name).shape[0]) // self.ranks
        return self.files.read(name, slice(self.rank * share, (self.rank + 1) * share))

    def columns(self, name: str) -> torch.Tensor:
        whole = self.files.read(name)
        share = whole.shape[1] // self.ranks
        return whole[:, self.rank * share : (self.rank + 1) * share]

    def gate_up(self, prefix: str) -> torch.Tensor:
        """`linear_fc1`: the rank's gate rows, then its up rows, of the HF MLP at `prefix`."""
        return torch.cat([self.rows(f"{prefix}.{p}_proj.weight") for p in ("gate", "up")])

    def attention_qkv(self, prefix: str, part: str) -> torch.Tensor:
        s = self.shape
        assert isinstance(s, DenseShape)
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
        if rest in WHOLE:
            return self.files.read(f"{layer}.{WHOLE[rest]}")
        if rest in LATENT_ROWS:
            return self.rows(f"{layer}.{LATENT_ROWS[rest]}")
        if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
            return self.attention_qkv(f"{layer}.self_attn", parts[-1])
        if rest == "self_attention.linear_proj.weight":
            return self.columns(f"{layer}.self_attn.o_proj.weight")
        mlp, fc = rest.removesuffix(".weight").rsplit(".", 1)  # e.g. mlp.shared_experts, linear_fc1
        if mlp.startswith("mlp.experts.local_experts."):  # the rank's own routed experts, whole
            assert isinstance(s, LatentShape)
            expert = self.expert_rank * (s.experts // self.expert_ranks) + int(mlp.rsplit(".", 1)[1])
            prefix = f"{layer}.mlp.experts.{expert}"
            if fc == "linear_fc1":
                return torch.cat([self.files.read(f"{prefix}.{p}_proj.weight") for p in ("gate", "up")])
            return self.files.read(f"{prefix}.down_proj.weight")
        if mlp in ("mlp", "mlp.shared_experts") and fc == "linear_fc1":
            return self.gate_up(f"{layer}.{mlp}")
        if mlp in ("mlp", "mlp.shared_experts") and fc == "linear_fc2":
            return self.columns(f"{layer}.{mlp}.down_proj.weight")
        raise KeyError(f"{name}: no HF tensor converts to this Megatron parameter")


def load_rank(model: nn.Module, weights: RankWeights) -> None:
    """Fill every parameter of `model` (this rank's part), and the routers' correction biases, from
    the folder."""
    tensors = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if n.endswith(".expert_bias"))]
    with torch.no_grad():
        for name, param in tensors:
            tensor = weights.tensor(name)
            check_shape(f"Megatron {name} from the HF folder", tensor, tuple(param.shape))
            param.copy_(tensor)
