"""Attention over a packed row, one sequence at a time, instead of under a block-diagonal mask.

A packed micro-batch is one row of L tokens holding sequences of lengths l_1..l_n. With the
stock `sdpa` path transformers builds an L×L block-diagonal causal mask and the kernel
computes every score, L² per head, of which only Σ l_i² / 2 are kept. Here the linear layers
still run on the packed row (no padding there, where most FLOPs are), but for attention each
sequence's queries are scattered into a `[n, max q]` batch and its keys and values gathered
into a `[n, max k]` one, attended with a causal kernel, and the outputs gathered back. Cost
n·max(q)·max(k) instead of L²; on the demo's 512-token rows of ~80-token sequences that is ~6×
less attention work, and it lets micro-batches grow. Where lengths are uneven (reasoning traces
of 20 to 400 tokens in one row) one padded query batch would again be mostly padding, so the
sequences are split by length into several, one kernel call each, where that scores fewer
pairs (`PackedLayout`).

A sequence may also see a prefix held elsewhere in the row: a prompt packed once for all its
sampled completions (rlvr.training.packing, `share_prompts`). Its keys are then the prefix's
tokens followed by its own, and its queries, its own tokens only, see the whole prefix.

This is the varlen attention of FlashAttention-2 (Dao 2023, `cu_seqlens`), with shared
prefixes, written with PyTorch ops so that it runs on CPU and on any device. It plugs into
transformers through its `AttentionInterface`, so it serves every model that dispatches
attention through it (`_supports_attention_backend`); others keep `sdpa` and the dense mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel

NAME = "rlvr_packed"


@dataclass(frozen=True)
class Segment:
    """A causal sequence in a packed row: queries are tokens [start, start + length); keys are
    tokens [prefix_start, prefix_start + prefix_len) (a shared prompt) followed by those."""

    start: int
    length: int
    prefix_start: int = 0
    prefix_len: int = 0


@dataclass(frozen=True)
class QueryBatch:
    """One attention call's share of a packed row: `num_sequences` of its sequences, their
    queries padded to `query_len`, against their rows of the layout's padded keys."""

    rows: torch.Tensor | None  # [n] the sequences' rows in the layout's keys; None: every row, in order
    prefix_lens: torch.Tensor | None  # [n] keys before each sequence's first query; None: all 0
    num_sequences: int
    query_len: int

    def to(self, device) -> QueryBatch:
        rows, prefix_lens = (None if t is None else t.to(device) for t in (self.rows, self.prefix_lens))
        return QueryBatch(rows, prefix_lens, self.num_sequences, self.query_len)


# What one more attention call costs, in query-key pairs it could have scored instead: its
# gathers and kernel launch. Sequences are split into several calls only where that saves more
# padding than this (see `_bucket`); a row of similar lengths stays one call.
CALL_OVERHEAD_PAIRS = 32768


@dataclass(frozen=True)
class PackedLayout:
    """Where each token of a packed row goes in the padded query and key batches.

    Keys: every sequence's, padded to the row's longest (`key_len`), gathered once. Queries: in
    one padded batch per attention call (`batches`). Sequences of very different lengths (a long
    reasoning trace among short ones) go to separate calls, each padded to its own longest
    query: one call for all would score n·max(q)·max(k) pairs, most of them padding. Keys keep
    the row's length in every call and are gathered once, so that the split changes no bit of
    the logprobs (measured on CPU, where a shorter key padding changes how the kernel's vectors
    split each key row, and a gather per call the order in which a shared prompt's key gradient
    adds up). Gradients are bit-identical too while every query is under 192 tokens (the
    demo's rows); past that, PyTorch's CPU kernel sums key gradients over query blocks sized by
    the call's longest query, so they differ from one padded batch's in the last bits (~4e-7
    of the largest on a long-tailed row)."""

    query_slot: torch.Tensor  # [L] each token's place in the batches' query slots, laid end to end
    key_index: torch.Tensor  # [n * key_len] the row token in each key slot (0 in padding), sequence by sequence
    key_len: int
    batches: tuple[QueryBatch, ...]

    @property
    def has_prefix(self) -> bool:
        return any(b.prefix_lens is not None for b in self.batches)

    @property
    def pairs(self) -> int:
        """Query-key pairs the attention calls score, padding and the causal half included."""
        return sum(b.num_sequences * b.query_len for b in self.batches) * self.key_len

    @classmethod
    def build(cls, segments: list[Segment]) -> PackedLayout:
        """The layout of a row whose every token is a query of exactly one segment."""
        key_len = max(s.prefix_len + s.length for s in segments)
        key_index = torch.zeros(len(segments) * key_len, dtype=torch.long)
        for i, s in enumerate(segments):
            keys = torch.cat(
                [torch.arange(s.prefix_start, s.prefix_start + s.prefix_len), torch.arange(s.start, s.start + s.length)]
            )
            key_index[i * key_len : i * key_len + len(keys)] = keys
        query_slot = torch.empty(sum(s.length for s in segments), dtype=torch.long)
        groups = _bucket(segments, key_len)
        batches, offset = [], 0
        for members in groups:
            query_len = max(segments[i].length for i in members)
            for k, i in enumerate(members):
                first = offset + k * query_len
                query_slot[segments[i].start : segments[i].start + segments[i].length] = torch.arange(
                    first, first + segments[i].length
                )
            shared = any(segments[i].prefix_len for i in members)
            prefix_lens = torch.tensor([segments[i].prefix_len for i in members]) if shared else None
            rows = None if len(groups) == 1 else torch.tensor(members)
            batches.append(QueryBatch(rows, prefix_lens, len(members), query_len))
            offset += len(members) * query_len
        return cls(query_slot, key_index, key_len, tuple(batches))

    @classmethod
    def single(cls, length: int, device=None) -> PackedLayout:
        """A row that is one causal sequence."""
        everything = torch.arange(length, device=device)
        return cls(everything, everything, length, (QueryBatch(None, None, 1, length),))

    def to(self, device) -> PackedLayout:
        return PackedLayout(
            self.query_slot.to(device),
            self.key_index.to(device),
            self.key_len,
            tuple(b.to(device) for b in self.batches),
        )


def _bucket(segments: list[Segment], key_len: int) -> list[list[int]]:
    """Segment indices grouped into attention calls, each group in row order: the grouping of
    the segments sorted by query length into runs that minimises the query rows padded plus
    CALL_OVERHEAD_PAIRS / key_len per call (dynamic programming over the runs, quadratic in the
    distinct lengths); one group when splitting saves nothing."""
    lengths: dict[int, list[int]] = {}
    for i, s in enumerate(segments):
        lengths.setdefault(s.length, []).append(i)
    blocks = sorted(lengths.items(), reverse=True)  # longest queries first
    overhead = CALL_OVERHEAD_PAIRS / key_len
    best: list[float] = [0] + [math.inf] * len(blocks)  # best[j]: least cost of blocks[:j]
    cut = [0] * (len(blocks) + 1)
    for j in range(1, len(blocks) + 1):
        count = 0
        for i in range(j - 1, -1, -1):  # the last run is blocks[i:j]; its longest queries are block i's
            count += len(blocks[i][1])
            cost = best[i] + count * blocks[i][0] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], len(blocks)
    while j > 0:
        runs.append(sorted(i for _, members in blocks[cut[j] : j] for i in members))
        j = cut[j]
    return sorted(runs)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    rlvr_layout: PackedLayout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: `[1, heads, L, dim]` in, `[1, L, heads, dim]` out.

    Without a layout (a call from outside the trainer's packed forward) the row is one sequence.
    """
    if query.shape[0] != 1:
        raise ValueError(f"{NAME} attention takes packed rows of batch size 1, got {query.shape[0]}")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError(f"{NAME} attention has no attention sinks: set trainer.attention: sdpa")
    layout = rlvr_layout or PackedLayout.single(query.shape[2], query.device)
    tokens = query[0].transpose(0, 1)  # [L, h, d]
    slots = sum(b.num_sequences * b.query_len for b in layout.batches)
    padded_queries = tokens.new_zeros(slots, *tokens.shape[1:]).index_copy(0, layout.query_slot, tokens)
    keys, values = (_keys(x, layout) for x in (key, value))  # [n, key_len, h_kv, d]
    outputs, offset = [], 0
    for batch in layout.batches:
        n, size = batch.num_sequences, batch.num_sequences * batch.query_len
        q = padded_queries[offset : offset + size].view(n, batch.query_len, *tokens.shape[1:]).transpose(1, 2)
        k, v = (x if batch.rows is None else x.index_select(0, batch.rows) for x in (keys, values))
        out = _attend(
            module,
            q,
            k.transpose(1, 2),
            v.transpose(1, 2),
            batch,
            layout.key_len,
            dropout,
            scaling,
            sliding_window,
            softcap,
        )
        outputs.append(out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[3]))  # [n * query_len, h, d]
        offset += size
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return out.index_select(0, layout.query_slot).unsqueeze(0), None


def _keys(x: torch.Tensor, layout: PackedLayout) -> torch.Tensor:  # [1, h, L, d] -> [n, key_len, h, d]
    gathered = x[0].transpose(0, 1).index_select(0, layout.key_index)
    return gathered.view(-1, layout.key_len, *gathered.shape[1:])


def _attend(
    module, q, k, v, batch: QueryBatch, key_len: int, dropout, scaling, sliding_window, softcap
) -> torch.Tensor:
    """Causal attention of one padded batch, `[n, h, query_len, d]` out."""
    windowed = sliding_window is not None and key_len > sliding_window
    needs_mask = windowed or softcap is not None or batch.prefix_lens is not None
    mask = _causal_mask(batch, key_len, sliding_window, q.device) if needs_mask else None
    groups = q.shape[1] // k.shape[1]
    if softcap is not None:
        return _softcapped(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), scaling, softcap, mask)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=mask is None,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
        enable_gqa=groups > 1,
    )


def _causal_mask(batch: QueryBatch, key_len: int, sliding_window: int | None, device) -> torch.Tensor:
    """[n or 1, 1, query_len, key_len], True where query i may see key j. Query i of a sequence
    with a prefix of p keys sits at key position p + i: it sees j <= p + i, and with a window
    only p + i - j < sliding_window. Padding keys lie beyond every real query's position."""
    i = torch.arange(batch.query_len, device=device)[:, None]
    j = torch.arange(key_len, device=device)[None, :]
    if batch.prefix_lens is not None:
        i = i + batch.prefix_lens.to(device)[:, None, None]
    mask = j <= i
    if sliding_window is not None:
        mask &= i - j < sliding_window
    return mask.view(-1, 1, batch.query_len, key_len)


def _softcapped(q, k, v, scaling, softcap, mask):
    """Gemma-2 style attention: scores squashed by softcap·tanh(s / softcap) before the softmax."""
    scores = q @ k.transpose(-1, -2) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
    scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) @ v


def use_packed_attention(model: PreTrainedModel) -> bool:
    """Switch `model` to packed attention where it dispatches through transformers' interface."""
    from transformers import AttentionInterface

    if not getattr(model, "_supports_attention_backend", False):
        return False
    AttentionInterface.register(NAME, packed_attention)
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
