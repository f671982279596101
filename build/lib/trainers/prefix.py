"""Shared-prompt layout of a micro-batch (verl's ``use_prefix_grouper``; trainers layer, pure torch).

The n samples of a GRPO group share one prompt. Here a micro-batch lays each distinct prompt out once,
followed by the responses of every sample that has it (a *segment*), and segments are bin-packed into rows
as in the packed layout. A 4-D boolean mask ``[rows, 1, W, W]`` lets a prompt token attend causally within
its prompt, and a response token attend to its segment's prompt and causally to its own response only;
``position_ids`` of every response continue from the prompt length. Each response then sees exactly the
keys and positions it sees alone, so log-probs are unchanged, and the prompt's activations are computed
(and back-propagated through) once per segment instead of once per sample: the gradient of a shared
computation is the sum of the per-sample gradients, exactly what the unshared micro-batch accumulates.

transformers (5.x ``masking_utils``) returns a 4-D mask as it is given, and its sdpa path hands it straight
to ``scaled_dot_product_attention`` (bool: True = attend). Its eager path *adds* the mask to the scores,
so ``trainers.model`` turns it into an additive float mask there; flash-attention kernels take no dense
mask at all. A dense mask costs ``rows × W²`` booleans, and sdpa with a mask cannot use the flash kernel
(it falls back to the memory-efficient or math kernel); the packed layout builds the same dense mask
internally from ``position_ids``, only with rows as wide as one sequence instead of one segment.
"""

from __future__ import annotations

from typing import Sequence

import torch

from trainers.batching import MicroBatch, Sample, by_prompt, micro_batch_from_layout, pack_rows

__all__ = ["collate_shared"]

_PROMPT = -1  # ``owner`` of a prompt token (any sample of the segment may attend to it)
_TAIL = -1  # ``segment`` of a row's tail padding (a block of its own, so no query row is fully masked)


def collate_shared(samples: Sequence[Sample]) -> MicroBatch:
    """Collate ``samples`` with one copy of each distinct prompt (see the module docstring).

    The response-aligned tensors (``labels``, ``valid``, masks, advantages, log-probs) are the same as
    ``collate``'s, so the loss code does not know which layout it got.
    """
    segs = by_prompt(samples)
    prompt_len = [len(samples[seg[0]].prompt_ids) for seg in segs]
    seg_len = [p + sum(len(samples[i].response_ids) for i in seg) for p, seg in zip(prompt_len, segs)]
    place, fills, width = pack_rows(seg_len)
    rows = len(fills)
    input_ids = torch.zeros(rows, width, dtype=torch.long)  # [rows, W]
    position_ids = torch.zeros(rows, width, dtype=torch.long)  # [rows, W]
    segment = torch.full((rows, width), _TAIL, dtype=torch.long)  # [rows, W] segment of each token
    owner = torch.full((rows, width), _PROMPT, dtype=torch.long)  # [rows, W] sample of a response token
    response_start = torch.zeros(len(samples), dtype=torch.long)  # [B] flat index of response token 0
    first_pred = torch.zeros(len(samples), dtype=torch.long)  # [B] flat index of the prompt's last token
    for k, (seg, (row, offset)) in enumerate(zip(segs, place)):
        p = prompt_len[k]
        input_ids[row, offset : offset + p] = torch.tensor(samples[seg[0]].prompt_ids)
        position_ids[row, offset : offset + p] = torch.arange(p)
        segment[row, offset : offset + seg_len[k]] = k
        cursor = offset + p
        for i in seg:
            n = len(samples[i].response_ids)
            input_ids[row, cursor : cursor + n] = torch.tensor(samples[i].response_ids)
            position_ids[row, cursor : cursor + n] = torch.arange(p, p + n)
            owner[row, cursor : cursor + n] = i
            response_start[i] = row * width + cursor
            first_pred[i] = row * width + offset + p - 1
            cursor += n
    for row, fill in enumerate(fills):
        position_ids[row, fill:] = torch.arange(width - fill)
    causal = torch.ones(width, width, dtype=torch.bool).tril()  # [W, W] key column <= query column
    same_segment = segment.unsqueeze(2) == segment.unsqueeze(1)  # [rows, W(q), W(k)]
    key_owner = owner.unsqueeze(1)  # [rows, 1, W(k)]
    visible = (key_owner == _PROMPT) | (key_owner == owner.unsqueeze(2))  # [rows, W(q), W(k)]
    attention_mask = (causal & same_segment & visible).unsqueeze(1)  # [rows, 1, W, W]
    return micro_batch_from_layout(samples, input_ids, position_ids, attention_mask, response_start,
                                   num_tokens=sum(seg_len), packed=True, first_pred=first_pred)
