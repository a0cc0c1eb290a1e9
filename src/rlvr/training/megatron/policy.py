"""The Megatron policy: a GPTModel split over the tensor-parallel ranks, read from the HF folder,
scoring packed micro-batches the way rlvr.training.policy.TokenLogprobs scores them for FSDP2."""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
from torch import nn

from rlvr.models.checkpoint_files import CheckpointFiles
from rlvr.models.folder import ModelFolder
from rlvr.training.attention import PackedLayout
from rlvr.training.logits_memory import chunk_tokens
from rlvr.training.megatron.gpt import DenseShape, build_gpt, final_hidden
from rlvr.training.megatron.parallel import tensor_rank
from rlvr.training.megatron.weights import load_rank
from rlvr.training.policy import score_in_chunks


class MegatronPolicy(nn.Module):
    """forward: (logprobs [T], entropy [T]) of a packed row's scored tokens, as TokenLogprobs's."""

    def __init__(self, folder: ModelFolder, dtype: torch.dtype, logits_chunk_mb: float):
        super().__init__()
        files = CheckpointFiles(folder)
        self.shape = DenseShape.of(folder.transformers_config(), "model.layers.0.self_attn.q_proj.bias" in files)
        rank, ranks = tensor_rank()
        self.gpt = build_gpt(self.shape, ranks, dtype)
        load_rank(self.gpt, files, self.shape, rank, ranks)
        self.logits_chunk_bytes = logits_chunk_mb * 1e6

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: PackedLayout | None) -> torch.Tensor:
        return final_hidden(self.gpt, input_ids, position_ids, layout)

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
