"""Sequence packing: sequences laid end to end in micro-batches of at most a token budget.

A packed micro-batch is one row `[1, L]` whose `position_ids` restart at 0 for every
sequence; transformers turns restarting positions into a block-diagonal causal mask, so no
token attends across sequences and no compute is spent on padding.

Ranks are balanced by tokens, and every rank gets the same number of micro-batches: FSDP2
gathers parameters collectively in each forward, so ranks must run the same number of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [1, L]
    position_ids: torch.Tensor  # [1, L]
    targets: torch.Tensor  # [1, L] next token id at each position, IGNORE where none is scored
    sequences: list[int]  # indices (into the step's batch) of the sequences packed here
    spans: list[tuple[int, int]]  # (first scored position, count) of each sequence's completion

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def is_empty(self) -> bool:
        return not self.sequences


def plan(
    sequences: list[list[int]], prompt_lens: list[int], world_size: int, token_budget: int
) -> list[list[MicroBatch]]:
    """Micro-batches for each rank: balanced by tokens, the same count on every rank, each
    within `token_budget` tokens.

    The completion of sequence i (tokens prompt_lens[i]:) is what gets scored: the logprob of
    token t is read at position t-1, so targets hold the next token at each scored position.
    """
    longest = max(len(s) for s in sequences)
    if longest > token_budget:
        raise ValueError(f"a sequence of {longest} tokens exceeds trainer.micro_batch_tokens={token_budget}")
    shards = _balance(sequences, list(range(len(sequences))), world_size)
    heaviest = max(sum(len(sequences[i]) for i in shard) for shard in shards)
    num_bins = max(1, -(-heaviest // token_budget))
    while True:
        bins = [_balance(sequences, shard, num_bins) for shard in shards]
        if all(sum(len(sequences[i]) for i in b) <= token_budget for rank in bins for b in rank):
            return [[_pack_one(sequences, prompt_lens, b) for b in rank] for rank in bins]
        num_bins += 1


def _balance(sequences: list[list[int]], indices: list[int], parts: int) -> list[list[int]]:
    """Split indices into `parts` groups of near-equal token count (longest first, to the lightest)."""
    groups: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in sorted(indices, key=lambda j: -len(sequences[j])):
        g = loads.index(min(loads))
        groups[g].append(i)
        loads[g] += len(sequences[i])
    return groups


def _pack_one(sequences: list[list[int]], prompt_lens: list[int], members: list[int]) -> MicroBatch:
    if not members:
        zero = torch.zeros(1, 1, dtype=torch.long)
        return MicroBatch(zero, zero.clone(), torch.full((1, 1), IGNORE), [], [])
    ids, positions, targets, spans = [], [], [], []
    for i in members:
        seq, p = sequences[i], prompt_lens[i]
        if not 0 < p < len(seq):
            raise ValueError(f"sequence {i}: prompt length {p} leaves no completion in {len(seq)} tokens")
        start = len(ids)
        ids.extend(seq)
        positions.extend(range(len(seq)))
        shifted = [IGNORE] * len(seq)
        shifted[p - 1 : len(seq) - 1] = seq[p:]
        targets.extend(shifted)
        spans.append((start + p - 1, len(seq) - p))
    return MicroBatch(
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([positions]),
        targets=torch.tensor([targets]),
        sequences=list(members),
        spans=spans,
    )


def unpack(values: torch.Tensor, batch: MicroBatch) -> list[torch.Tensor]:
    """Per-position values `[L]` of a micro-batch → one tensor per packed completion."""
    return [values[start : start + count] for start, count in batch.spans]
