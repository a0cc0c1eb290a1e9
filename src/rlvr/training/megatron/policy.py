"""The Megatron policy: a GPTModel split over the tensor-parallel ranks (and its routed experts
over the expert-parallel ones), read from the HF folder, scoring packed micro-batches the way
rlvr.training.policy.TokenLogprobs scores them for FSDP2.

A quantized base (NVFP4, NF4) is read from its dequantized view (rlvr.quant.checkpoint.dequantized_view,
the float folder vLLM serves on CPU) into the compute dtype: the values its packed layers compute
with, held in full precision, not 4-bit."""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
from torch import nn

from rlvr.models.checkpoint_files import CheckpointFiles
from rlvr.models.folder import as_model_folder
from rlvr.models.moe import MoELayer
from rlvr.quant.checkpoint import dequantized_view
from rlvr.quant.formats import is_quantized_checkpoint
from rlvr.training.attention import PackedLayout
from rlvr.training.logits_memory import chunk_tokens
from rlvr.training.megatron import gpt, mla
from rlvr.training.megatron.parallel import expert_rank, tensor_rank
from rlvr.training.megatron.weights import RankWeights, load_rank
from rlvr.training.policy import score_in_chunks


class MegatronPolicy(nn.Module):
    """forward: (logprobs [T], entropy [T]) of a packed row's scored tokens, as TokenLogprobs's."""

    def __init__(self, path: str, dtype: torch.dtype, logits_chunk_mb: float):
        super().__init__()
        folder = as_model_folder(path)
        if is_quantized_checkpoint(folder):
            folder = as_model_folder(dequantized_view(folder))
        files = CheckpointFiles(folder)
        config = folder.transformers_config()
        rank, ranks = tensor_rank()
        experts_at, expert_ranks = expert_rank()
        self.shape: gpt.DenseShape | mla.LatentShape
        if config.model_type in mla.LATENT:
            self.shape = mla.LatentShape.of(config)
            self.gpt = mla.build_gpt(self.shape, ranks, expert_ranks, dtype)
        else:
            self.shape = gpt.DenseShape.of(config, "model.layers.0.self_attn.q_proj.bias" in files)
            self.gpt = gpt.build_gpt(self.shape, ranks, dtype)
        self.family = mla if isinstance(self.shape, mla.LatentShape) else gpt
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
