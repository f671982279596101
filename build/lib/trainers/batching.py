"""Trajectories → training tensors: samples, micro-batch collation, micro-batch and rank planning
(trainers layer, pure torch + verl ``seqlen_balancing``, no distributed calls).

Every rank holds the whole step batch, so every rank computes the same plan: which trajectories go to
which rank in each mini-batch (verl's Karmarkar-Karp balanced partitions), how each rank cuts its share
into micro-batches (fixed count, or a token budget: verl's workload-balanced partitions of real tokens
when packed, length-sorted cuts bounding padded slots when padded), and how many micro-batches every rank runs (the max
over ranks; FSDP collectives need the same number of forward/backward passes on every rank, so a rank
with fewer runs "filler" micro-batches whose loss mask is all zero).

Two layouts: ``packed`` bin-packs the micro-batch's sequences into rows as wide as its longest sequence,
``position_ids`` restarting at 0 per sequence and no attention mask; transformers (≥ 4.53: sdpa, flash,
eager) then builds a block-diagonal causal mask, so only row tails are padding. ``padded`` right-pads
every sequence to the longest one. Packing is exact with sdpa on CPU (tested). Rows rather than one long
pack because sdpa attends densely within a row (O(W²) per row); flash-attn varlen on GPU could take one
row with no padding at all. A third layout, one copy of each shared prompt (``trainers.prefix``), is
planned here too (``share_prompts``): group members kept together, budgets counting tokens as laid out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Sequence

import torch
from tensordict import TensorDict
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions, rearrange_micro_batches

from agents.records import Trajectory
from trainers.grpo import GlobalBatchInfo

__all__ = [
    "MicroBatch",
    "MiniBatchPlan",
    "Sample",
    "by_prompt",
    "collate",
    "dynamic_micro_batches",
    "filler",
    "fixed_micro_batches",
    "micro_batch_from_layout",
    "mini_batches_by_group",
    "pack_rows",
    "padded_micro_batches",
    "plan_step",
    "rank_partitions",
    "samples_from_trajectories",
    "shared_micro_batches",
]


@dataclass(frozen=True)
class Sample:
    """One trajectory ready to collate; ``old_log_prob``/``ref_log_prob`` are filled in per step ``[R]``."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    advantage: float
    group_id: str
    old_log_prob: torch.Tensor | None = None
    ref_log_prob: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def samples_from_trajectories(
    trajectories: Sequence[Trajectory], advantages: Sequence[float], max_response_length: int
) -> list[Sample]:
    """Pair trajectories with their advantages; a response longer than the budget names its trajectory."""
    samples = []
    for traj, adv in zip(trajectories, advantages, strict=True):
        if not traj.response_ids:
            raise ValueError(f"trajectory {traj.trajectory_id!r}: empty response")
        if len(traj.response_ids) > max_response_length:
            raise ValueError(
                f"trajectory {traj.trajectory_id!r}: {len(traj.response_ids)} response tokens exceed "
                f"data.max_response_length={max_response_length}"
            )
        samples.append(Sample(traj.prompt_ids, traj.response_ids, traj.response_mask, traj.rollout_logprobs,
                              float(adv), traj.group_id))
    return samples


def filler(sample: Sample) -> Sample:
    """A copy of ``sample`` that contributes nothing to the loss (all-zero mask): keeps FSDP ranks in step."""
    return replace(sample, response_mask=(0,) * len(sample.response_mask))


@dataclass(frozen=True)
class MicroBatch:
    """Collated tensors of one micro-batch. ``rows × cols`` is ``1 × N`` packed or ``B × T`` padded;
    response-aligned tensors are ``[B, R]`` with ``R`` the longest response here."""

    input_ids: torch.Tensor  # [rows, cols] long
    position_ids: torch.Tensor  # [rows, cols] long
    # [rows, cols] long when padded; None when packed; [rows, 1, cols, cols] bool (True = may attend) in the
    # shared-prompt layout (trainers.prefix)
    attention_mask: torch.Tensor | None
    pred_index: torch.Tensor  # [B, R] flat index into [rows*cols] of the logit predicting response token j
    labels: torch.Tensor  # [B, R] response token ids (0 past the end)
    valid: torch.Tensor  # [B, R] bool, j < len(response)
    response_mask: torch.Tensor  # [B, R] float
    advantages: torch.Tensor  # [B, R] float, the trajectory's advantage on every valid token
    rollout_log_probs: torch.Tensor  # [B, R]
    old_log_probs: torch.Tensor | None  # [B, R]
    ref_log_probs: torch.Tensor | None  # [B, R]
    num_tokens: int  # real (unpadded) tokens
    packed: bool

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())


def _pad_rows(rows: list[Sequence[float]] | list[torch.Tensor], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def pack_rows(lengths: Sequence[int]) -> tuple[list[tuple[int, int]], list[int], int]:
    """First-fit-decreasing bin packing into rows as wide as the longest sequence: (row, offset) per item,
    each row's fill, and the width."""
    width = max(lengths)
    fills: list[int] = []
    place: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        row = next((r for r, fill in enumerate(fills) if fill + lengths[i] <= width), len(fills))
        if row == len(fills):
            fills.append(0)
        place[i] = (row, fills[row])
        fills[row] += lengths[i]
    return place, fills, width


def collate(samples: Sequence[Sample], packed: bool) -> MicroBatch:
    """Collate samples into one micro-batch.

    ``packed``: sequences are bin-packed into rows as wide as the longest one, ``position_ids`` restarting
    at 0 per sequence (and for the tail padding of a row, which forms its own block), no attention mask.
    Rows bound the attention cost like padding does, while padding shrinks to row tails.
    Otherwise: one right-padded row per sequence with an attention mask.
    """
    lengths = [s.length for s in samples]
    seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    if packed:
        place, fills, width = pack_rows(lengths)
        input_ids = torch.zeros(len(fills), width, dtype=torch.long)  # [rows, W]
        position_ids = torch.zeros(len(fills), width, dtype=torch.long)  # [rows, W]
        for seq, (row, offset) in zip(seqs, place):
            input_ids[row, offset : offset + len(seq)] = torch.tensor(seq)
            position_ids[row, offset : offset + len(seq)] = torch.arange(len(seq))
        for row, fill in enumerate(fills):
            position_ids[row, fill:] = torch.arange(width - fill)
        attention_mask = None
        starts = torch.tensor([row * width + offset for row, offset in place])  # [B] flat offset of each sequence
    else:
        width = max(lengths)
        input_ids = _pad_rows(seqs, width, torch.long)  # [B, T]
        attention_mask = _pad_rows([[1] * n for n in lengths], width, torch.long)  # [B, T]
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]
        starts = torch.arange(len(samples)) * width
    prompt_lens = torch.tensor([len(s.prompt_ids) for s in samples])  # [B]
    return micro_batch_from_layout(samples, input_ids, position_ids, attention_mask, starts + prompt_lens,
                                   num_tokens=sum(lengths), packed=packed)


def micro_batch_from_layout(
    samples: Sequence[Sample], input_ids: torch.Tensor, position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None, response_start: torch.Tensor, num_tokens: int, packed: bool,
    first_pred: torch.Tensor | None = None,
) -> MicroBatch:
    """A ``MicroBatch`` from a token layout. ``response_start`` ``[B]``: flat index (into ``[rows*cols]``) of
    each response's first token; ``first_pred`` ``[B]``: flat index of the logit predicting that token when
    it is not the one just before it (the shared-prompt layout, where it is the prompt's last token)."""
    resp_len = max(len(s.response_ids) for s in samples)
    j = torch.arange(resp_len).unsqueeze(0)  # [1, R]
    valid = j < torch.tensor([len(s.response_ids) for s in samples]).unsqueeze(1)  # [B, R]
    # The logit at position p predicts token p+1, so response token j is predicted at response_start + j - 1.
    pred_index = response_start.unsqueeze(1) - 1 + j  # [B, R]
    if first_pred is not None:
        pred_index[:, 0] = first_pred
    pred_index = torch.where(valid, pred_index, 0)  # [B, R]
    olds = [s.old_log_prob for s in samples]
    refs = [s.ref_log_prob for s in samples]
    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        pred_index=pred_index,
        labels=_pad_rows([s.response_ids for s in samples], resp_len, torch.long),
        valid=valid,
        response_mask=_pad_rows([s.response_mask for s in samples], resp_len, torch.float32),
        advantages=torch.tensor([s.advantage for s in samples]).unsqueeze(1) * valid,
        rollout_log_probs=_pad_rows([s.rollout_logprobs for s in samples], resp_len, torch.float32),
        old_log_probs=None if any(o is None for o in olds) else _pad_rows(olds, resp_len, torch.float32),
        ref_log_probs=None if any(r is None for r in refs) else _pad_rows(refs, resp_len, torch.float32),
        num_tokens=num_tokens,
        packed=packed,
    )


def fixed_micro_batches(count: int, size: int) -> list[list[int]]:
    """verl's fixed micro-batches: consecutive chunks of ``size`` items."""
    return [list(range(i, min(i + size, count))) for i in range(0, count, size)]


def dynamic_micro_batches(lengths: Sequence[int], max_token_len: int, min_count: int | None = None) -> list[list[int]]:
    """Token-budget micro-batches (verl ``rearrange_micro_batches``): each holds ≤ ``max_token_len`` real
    tokens, workload-balanced; at least ``min_count`` of them when given."""
    if max(lengths) > max_token_len:
        raise ValueError(
            f"a {max(lengths)}-token trajectory exceeds actor.ppo_max_token_len_per_gpu={max_token_len}"
        )
    width = max(lengths)
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()  # [B, T]
    batch = TensorDict({"input_ids": mask, "attention_mask": mask}, batch_size=[len(lengths)])
    _, indices = rearrange_micro_batches(batch, max_token_len=max_token_len, min_num_micro_batch=min_count)
    return [sorted(part) for part in indices]


def padded_micro_batches(lengths: Sequence[int], max_token_len: int, min_count: int | None = None) -> list[list[int]]:
    """Token-budget micro-batches for the padded layout: length-sorted, so rows in a micro-batch have similar
    lengths, and the budget bounds padded slots (rows × longest row ≤ ``max_token_len``). verl's balanced
    partitions mix long and short rows, which is right when packing and the worst case when padding."""
    if max(lengths) > max_token_len:
        raise ValueError(
            f"a {max(lengths)}-token trajectory exceeds actor.ppo_max_token_len_per_gpu={max_token_len}"
        )
    parts: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        if parts and (len(parts[-1]) + 1) * lengths[parts[-1][0]] <= max_token_len:
            parts[-1].append(i)
        else:
            parts.append([i])
    while min_count and len(parts) < min_count and max(len(p) for p in parts) > 1:
        big = max(range(len(parts)), key=lambda k: len(parts[k]))
        half = len(parts[big]) // 2
        parts[big : big + 1] = [parts[big][:half], parts[big][half:]]
    return [sorted(p) for p in parts]


def by_prompt(samples: Sequence[Sample]) -> list[list[int]]:
    """Indices of ``samples`` grouped by identical ``prompt_ids``, in order of first appearance: the samples
    the shared-prompt layout lays out behind one prompt. Keyed by the tokens, not the group id, so a sample
    whose prompt differs from its group's is never wrongly shared."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, sample in enumerate(samples):
        groups.setdefault(sample.prompt_ids, []).append(i)
    return list(groups.values())


def _shared_len(samples: Sequence[Sample], unit: Sequence[int]) -> int:  # one prompt + the unit's responses
    return len(samples[unit[0]].prompt_ids) + sum(len(samples[i].response_ids) for i in unit)


def shared_micro_batches(
    samples: Sequence[Sample], max_token_len: int, min_count: int | None = None
) -> list[list[int]]:
    """Token-budget micro-batches for the shared-prompt layout: each holds ≤ ``max_token_len`` tokens as laid
    out (a prompt once, then its samples' responses), at least ``min_count`` of them when given.

    Units are runs of one prompt's samples that fit the budget together; verl's balanced partition spreads
    units over the fewest micro-batches whose summed unit lengths fit. Two units of one prompt that land in
    one micro-batch share their prompt there too, so the sum over-counts: the budget stays an upper bound.
    """
    longest = max(s.length for s in samples)
    if longest > max_token_len:
        raise ValueError(f"a {longest}-token trajectory exceeds actor.ppo_max_token_len_per_gpu={max_token_len}")
    units: list[list[int]] = []
    for seg in by_prompt(samples):
        units.append([])
        for i in seg:
            if units[-1] and _shared_len(samples, [*units[-1], i]) > max_token_len:
                units.append([])
            units[-1].append(i)
    while min_count and len(units) < min_count and any(len(u) > 1 for u in units):
        big = max((k for k in range(len(units)) if len(units[k]) > 1), key=lambda k: _shared_len(samples, units[k]))
        half = len(units[big]) // 2
        units[big : big + 1] = [units[big][:half], units[big][half:]]
    costs = [_shared_len(samples, u) for u in units]
    count = min(len(units), max(min_count or 1, -(-sum(costs) // max_token_len)))
    while True:  # the ceil-division count is a lower bound; units are indivisible
        parts = get_seqlen_balanced_partitions(costs, count, equal_size=False)
        if all(sum(costs[k] for k in part) <= max_token_len for part in parts):
            return [sorted(i for k in part for i in units[k]) for part in parts]
        count += 1


def rank_partitions(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Balanced split of items over ranks by token count (verl Karmarkar-Karp); a rank may get none
    when there are fewer items than ranks."""
    if len(lengths) < world_size:
        return [[i] if i < len(lengths) else [] for i in range(world_size)]
    equal = len(lengths) % world_size == 0
    return get_seqlen_balanced_partitions(list(lengths), world_size, equal_size=equal)


def mini_batches_by_group(
    group_ids: Sequence[str], groups_per_mini_batch: int, shuffle_seed: int | None
) -> list[list[int]]:
    """Cut the step batch into mini-batches of ``groups_per_mini_batch`` whole groups (verl's
    ``ppo_mini_batch_size`` counts prompts); ``shuffle_seed`` shuffles the group order."""
    order: dict[str, list[int]] = {}
    for i, gid in enumerate(group_ids):
        order.setdefault(gid, []).append(i)
    groups = list(order.values())
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(groups)
    return [
        sorted(i for g in groups[k : k + groups_per_mini_batch] for i in g)
        for k in range(0, len(groups), groups_per_mini_batch)
    ]


@dataclass(frozen=True)
class MiniBatchPlan:
    """One mini-batch as one rank runs it: micro-batches of indices into the step batch (an empty list is a
    filler), and the counts over all ranks that normalise the loss."""

    micro_batches: list[list[int]]
    info: GlobalBatchInfo
    filler_index: int  # a real item to copy for filler micro-batches


def _rank_micro_batches(
    items: Sequence[Sample], use_dynamic_bsz: bool, packed: bool, share_prompts: bool, micro_batch_size: int,
    max_token_len: int, min_count: int,
) -> list[list[int]]:
    if not items:
        return []
    if use_dynamic_bsz:
        # Cut into at least `min_count` micro-batches when there are enough items, so that ranks agree
        # on the count without filler passes where possible.
        least = min(min_count, len(items)) or None
        if share_prompts:
            return shared_micro_batches(items, max_token_len, least)
        cut = dynamic_micro_batches if packed else padded_micro_batches
        return cut([s.length for s in items], max_token_len, least)
    if share_prompts:
        # Chunks of the items ordered by prompt: a group's samples share micro-batches even when interleaved.
        order = [i for seg in by_prompt(items) for i in seg]
        return [[order[i] for i in mb] for mb in fixed_micro_batches(len(items), micro_batch_size)]
    return fixed_micro_batches(len(items), micro_batch_size)


def _micro_batches_all_ranks(
    samples: Sequence[Sample], parts: list[list[int]], use_dynamic_bsz: bool, packed: bool, share_prompts: bool,
    micro_batch_size: int, max_token_len: int,
) -> list[list[list[int]]]:
    """Micro-batches of every rank, re-cut until the count agrees (it only grows, bounded by items)."""
    count = 0
    while True:
        per_rank = [
            [[part[i] for i in mb] for mb in _rank_micro_batches(
                [samples[i] for i in part], use_dynamic_bsz, packed, share_prompts, micro_batch_size,
                max_token_len, count)]
            for part in parts
        ]
        new_count = max(len(mbs) for mbs in per_rank)
        if new_count == count or not use_dynamic_bsz:
            return [mbs + [[] for _ in range(new_count - len(mbs))] for mbs in per_rank]
        count = new_count


def plan_step(
    samples: Sequence[Sample],
    *,
    rank: int,
    world_size: int,
    groups_per_mini_batch: int,
    use_dynamic_bsz: bool,
    micro_batch_size: int,
    max_token_len: int,
    packed: bool = True,
    share_prompts: bool = False,
    shuffle_seed: int | None = None,
) -> list[MiniBatchPlan]:
    """The same plan on every rank: mini-batches by group, balanced across ranks, micro-batched per rank.

    ``share_prompts`` plans for the shared-prompt layout (``trainers.prefix``): fixed micro-batches keep
    samples with one prompt together, token budgets count a prompt once per micro-batch. Ranks are still
    balanced by unshared lengths, so a group may be split over ranks (each part still shares its prompt).
    """
    plans = []
    for mini in mini_batches_by_group([s.group_id for s in samples], groups_per_mini_batch, shuffle_seed):
        parts = [[mini[i] for i in part] for part in rank_partitions([samples[i].length for i in mini], world_size)]
        per_rank = _micro_batches_all_ranks(samples, parts, use_dynamic_bsz, packed, share_prompts,
                                            micro_batch_size, max_token_len)
        tokens = sum(sum(samples[i].response_mask) for i in mini)
        seqs = sum(1 for i in mini if any(samples[i].response_mask))
        info = GlobalBatchInfo(dp_size=world_size, batch_num_tokens=max(tokens, 1), global_batch_size=max(seqs, 1))
        plans.append(MiniBatchPlan(micro_batches=per_rank[rank], info=info, filler_index=mini[0]))
    return plans
