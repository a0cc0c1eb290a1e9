"""Sequence packing: sequences laid end to end in micro-batches of at most a token budget.

A packed micro-batch is one row `[1, L]`. Each unit in it is a prompt followed by one or more
completions of that prompt. With `share_prompts` (which needs rlvr's packed attention) the
samples of one prompt form one unit: the prompt's tokens run through the model once, and each
completion attends to them and to itself (positions continue from the prompt's end), so a
group of k samples costs P + Σ C_j tokens instead of k·P + Σ C_j. This is exact: the shared
prompt's hidden states, and the gradient through them, are what k copies would give (Prefix
Grouper, Liu et al. 2025). Without it every completion has its own prompt copy and positions
restart at 0 for every sequence, which transformers' own attention turns into a
block-diagonal causal mask.

Only completion tokens are scored: the logprob of token t is read at the hidden state of the
position before it (for a completion's first token, its prompt's last one), so the LM head
runs on those positions alone.

Ranks are balanced by tokens, and every rank gets the same number of micro-batches: FSDP2
gathers parameters collectively in each forward, so ranks must run the same number of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.training.attention import PackedLayout, Segment


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [1, L]
    position_ids: torch.Tensor  # [1, L]
    score_positions: torch.Tensor  # [T] row position whose hidden state scores each completion token
    score_targets: torch.Tensor  # [T] that token
    sequences: list[int]  # indices (into the step's batch) of the completions packed here
    spans: list[tuple[int, int]]  # (start, count) of each completion's tokens among the T scored
    layout: PackedLayout  # which tokens each token attends to (used by rlvr's packed attention)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def is_empty(self) -> bool:
        return not self.sequences


@dataclass
class _Unit:
    """One prompt and the completions (indices into the step's sequences) packed after it."""

    prompt_len: int
    members: list[int]
    tokens: int


def plan(
    sequences: list[list[int]],
    prompt_lens: list[int],
    world_size: int,
    token_budget: int,
    share_prompts: bool = False,
) -> list[list[MicroBatch]]:
    """Micro-batches for each rank: balanced by tokens, the same count on every rank, each
    within `token_budget` tokens. Sequence i is prompt sequences[i][:prompt_lens[i]] followed by
    its completion; `share_prompts` packs completions of the same prompt after one copy of it."""
    for i, (seq, p) in enumerate(zip(sequences, prompt_lens)):
        if not 0 < p < len(seq):
            raise ValueError(f"sequence {i}: prompt length {p} leaves no completion in {len(seq)} tokens")
    longest = max(len(s) for s in sequences)
    if longest > token_budget:
        raise ValueError(f"a sequence of {longest} tokens exceeds trainer.micro_batch_tokens={token_budget}")
    units = _units(sequences, prompt_lens, token_budget, share_prompts)
    shards = _balance(units, world_size)
    heaviest = max(sum(u.tokens for u in shard) for shard in shards)
    num_bins = max(1, -(-heaviest // token_budget))
    while True:
        bins = [_balance(shard, num_bins) for shard in shards]
        if all(sum(u.tokens for u in b) <= token_budget for rank in bins for b in rank):
            return [[_pack_one(sequences, b) for b in rank] for rank in bins]
        num_bins += 1


def _units(sequences: list[list[int]], prompt_lens: list[int], token_budget: int, share: bool) -> list[_Unit]:
    """One unit per sequence, or with `share` one per distinct prompt (split where its
    completions would not fit the budget after one prompt copy)."""
    if not share:
        return [_Unit(p, [i], len(s)) for i, (s, p) in enumerate(zip(sequences, prompt_lens))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (seq, p) in enumerate(zip(sequences, prompt_lens)):
        groups.setdefault(tuple(seq[:p]), []).append(i)
    units = []
    for prompt, members in groups.items():
        unit = _Unit(len(prompt), [], len(prompt))
        for i in members:
            completion = len(sequences[i]) - len(prompt)
            if unit.members and unit.tokens + completion > token_budget:
                units.append(unit)
                unit = _Unit(len(prompt), [], len(prompt))
            unit.members.append(i)
            unit.tokens += completion
        units.append(unit)
    return units


def _balance(units: list[_Unit], parts: int) -> list[list[_Unit]]:
    """Split units into `parts` groups of near-equal token count (largest first, to the lightest)."""
    groups: list[list[_Unit]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for unit in sorted(units, key=lambda u: -u.tokens):
        g = loads.index(min(loads))
        groups[g].append(unit)
        loads[g] += unit.tokens
    return groups


def _pack_one(sequences: list[list[int]], units: list[_Unit]) -> MicroBatch:
    if not units:  # a rank with nothing to do still runs a forward, in step with the others'
        zero = torch.zeros(1, 1, dtype=torch.long)
        return MicroBatch(
            zero, zero.clone(), zero[0].clone(), zero[0].clone(), [], [], PackedLayout.build([Segment(0, 1)])
        )
    ids: list[int] = []
    positions: list[int] = []
    score_positions: list[int] = []
    score_targets: list[int] = []
    members: list[int] = []
    spans: list[tuple[int, int]] = []
    segments: list[Segment] = []
    for unit in units:
        p = unit.prompt_len
        prompt_start = len(ids)
        ids.extend(sequences[unit.members[0]][:p])
        positions.extend(range(p))
        if len(unit.members) > 1:
            segments.append(Segment(prompt_start, p))
        for i in unit.members:
            completion = sequences[i][p:]
            start = len(ids)
            ids.extend(completion)
            positions.extend(range(p, p + len(completion)))
            if len(unit.members) > 1:
                segments.append(Segment(start, len(completion), prefix_start=prompt_start, prefix_len=p))
            else:
                segments.append(Segment(prompt_start, p + len(completion)))
            spans.append((len(score_positions), len(completion)))
            score_positions.append(prompt_start + p - 1)
            score_positions.extend(range(start, start + len(completion) - 1))
            score_targets.extend(completion)
            members.append(i)
    return MicroBatch(
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([positions]),
        score_positions=torch.tensor(score_positions),
        score_targets=torch.tensor(score_targets),
        sequences=members,
        spans=spans,
        layout=PackedLayout.build(segments),
    )


def split_by_group(group: list[int], count: int) -> list[list[int]]:
    """Sequence indices in `count` mini-batches of whole groups (a prompt's samples stay together,
    so each update sees complete GRPO groups): groups in order of first appearance, as equal in
    number as they divide, never more mini-batches than groups; indices ascending in each."""
    members: dict[int, list[int]] = {}
    for index, g in enumerate(group):
        members.setdefault(g, []).append(index)
    groups = list(members.values())
    count = min(count, len(groups))
    bounds = [round(k * len(groups) / count) for k in range(count + 1)]
    return [sorted(i for g in groups[lo:hi] for i in g) for lo, hi in zip(bounds, bounds[1:])]


def unpack(values: torch.Tensor, batch: MicroBatch) -> list[torch.Tensor]:
    """Per-scored-token values `[T]` of a micro-batch → one tensor per packed completion."""
    return [values[start : start + count] for start, count in batch.spans]
