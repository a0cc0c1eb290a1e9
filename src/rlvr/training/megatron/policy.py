"""The Megatron policy: a GPTModel split over the tensor-parallel ranks (and its routed experts
over the expert-parallel ones), read from the HF folder, scoring packed micro-batches the way
rlvr.training.policy.TokenLogprobs scores them for FSDP2.

A quantized base (NVFP4, NF4) is read from its dequantized view (rlvr.quant.checkpoint.dequantized_view,
the float folder vLLM serves on CPU) into the compute dtype: the values its packed layers compute
with, held in full precision, not 4-bit."""

from __future__ import annotations

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
from torch import nn

from rlvr.models.checkpoint_files import CheckpointFiles
from rlvr.models.folder import ModelFolder, read_model_folder
from rlvr.models.moe import MoELayer
from rlvr.quant.checkpoint import dequantized_view
from rlvr.quant.formats import is_quantized_checkpoint
from rlvr.training.attention import PackedLayout
from rlvr.training.logits_memory import chunk_tokens
from rlvr.training.megatron import gpt, mla
from rlvr.training.megatron.parallel import expert_rank, tensor_rank
from rlvr.training.megatron.weights import RankWeights, load_rank
from rlvr.training.policy import score_in_chunks


def build_rank_model(config, qkv_bias: bool, dtype: torch.dtype) -> tuple[gpt.DenseShape | mla.LatentShape, GPTModel]:
    """This rank's part of megatron-core's model of the transformers `config` (dense, or MLA + MoE),
    at its tensor- and expert-parallel place, with no weights read: what the rank loads into and
    what `rlvr rehearse` measures."""
    tensor_ranks, expert_ranks = tensor_rank()[1], expert_rank()[1]
    if config.model_type in mla.LATENT:
        latent = mla.LatentShape.of(config)
        return latent, mla.build_gpt(latent, tensor_ranks, expert_ranks, dtype)
    dense = gpt.DenseShape.of(config, qkv_bias)
    return dense, gpt.build_gpt(dense, tensor_ranks, dtype)


class MegatronPolicy(nn.Module):
    """forward: (logprobs [T], entropy [T]) of a packed row's scored tokens, as TokenLogprobs's."""

    def __init__(self, folder: ModelFolder, dtype: torch.dtype, logits_chunk_mb: float):
        super().__init__()
        if is_quantized_checkpoint(folder):
            folder = read_model_folder(dequantized_view(folder))
        files = CheckpointFiles(folder)
        config = folder.transformers_config()
        self.shape, self.gpt = build_rank_model(config, "model.layers.0.self_attn.q_proj.bias" in files, dtype)
        self.family = mla if isinstance(self.shape, mla.LatentShape) else gpt
        (rank, ranks), (experts_at, expert_ranks) = tensor_rank(), expert_rank()
        load_rank(self.gpt, RankWeights(files, self.shape, rank, ranks, experts_at, expert_ranks))
        self.logits_chunk_bytes = logits_chunk_mb * 1e6

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: PackedLayout | None) -> torch.Tensor:
        return self.family.final_hidden(self.gpt, input_ids, position_ids, layout)

    def moe_layers(self) -> list[MoELayer]:
        """The routers and experts this rank runs, for routing replay (none in a dense model)."""
        return mla.moe_layers(self.gpt) if isinstance(self.shape, mla.LatentShape) else []

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[T, vocab]`: each rank computes its rows of the vocabulary, then all of them are gathered."""
        weight = self.gpt.shared_embedding_or_output_weight() if self.gpt.share_embeddings_and_output_weights else None
        part, _ = self.gpt.output_layer(hidden[:, None], weight=weight)
        return gather_from_tensor_model_parallel_region(part)[:, 0]

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        score_positions: torch.Tensor,
        score_targets: torch.Tensor,
        temperature: float = 1.0,
        layout: PackedLayout | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.hidden(input_ids, position_ids, layout).index_select(0, score_positions)
        chunk = chunk_tokens(self.logits_chunk_bytes, self.shape.vocab_size, hidden.dtype.itemsize, softcapped=False)
        return score_in_chunks(self.logits, hidden, score_targets, chunk, temperature)
