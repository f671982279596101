"""Per-row sampling and the left-padded batch KV cache of ``HFEngine`` (deployments layer).

Pure tensor code, no event loop: ``sample_next`` samples one token per row with that row's own
settings and generator; ``merge_batches`` / ``keep_rows`` add and drop rows of a running batch whose
rows are right-aligned in one ``DynamicCache`` (shorter rows left-padded with zeros the mask hides).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import DynamicCache

from agents.records import FinishReason, SamplingParams


@dataclass(eq=False)
class RequestState:
    """Mutable state of one request, owned by the engine loop."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator
    future: asyncio.Future
    policy_version: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)  # the adapter version that sampled each token
    finish_reason: FinishReason | None = None


@dataclass(eq=False)
class RunningBatch:
    """Rows decoding together. Row i of every tensor belongs to ``requests[i]``."""

    requests: list[RequestState]
    cache: DynamicCache  # per layer keys/values [B, H, T, D], rows right-aligned
    attention_mask: torch.Tensor  # [B, T] 1 = token in the cache, 0 = left padding
    next_ids: torch.Tensor  # [B] last sampled token of each row, not yet in the cache


def _filter_logits(scaled: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Top-k then top-p on one row of temperature-scaled logits; dropped tokens get -inf. [V] -> [V]."""
    if 0 < sampling.top_k < scaled.numel():
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)  # [V]
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (the top one always stays)
        drop_sorted = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def _filtered_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Sampling distribution of one row: softmax(logits / T) after top-k and top-p. [V] -> [V]."""
    return torch.softmax(_filter_logits(logits / sampling.temperature, sampling), dim=-1)


def sample_next(logits: torch.Tensor, requests: Sequence[RequestState]) -> tuple[list[int], list[float]]:
    """One token per row. logits [B, V] -> token ids [B], raw-model log-probs [B].

    Sampling is inverse-CDF with one uniform draw per row from the row's own generator: batched, and
    a row's draws do not depend on which other rows share the step.
    """
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)  # [B, V]
    temperatures = torch.tensor([r.sampling.temperature for r in requests])  # [B]
    greedy = temperatures == 0
    scaled = logits / torch.where(greedy, 1.0, temperatures).unsqueeze(1)  # [B, V]
    for row, req in enumerate(requests):
        if not greedy[row] and (req.sampling.top_k > 0 or req.sampling.top_p < 1.0):
            scaled[row] = _filter_logits(scaled[row], req.sampling)
    cdf = torch.cumsum(torch.softmax(scaled, dim=-1).double(), dim=-1)  # [B, V]
    uniform = torch.cat([torch.rand(1, generator=r.generator, dtype=torch.float64) for r in requests])  # [B]
    # right=True: the first token whose cumulative mass exceeds the draw, never a zero-probability one
    drawn = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)  # [B]
    tokens = torch.where(greedy, torch.argmax(logits, dim=-1), drawn.clamp(max=logits.shape[1] - 1))
    picked = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)  # [B]
    return tokens.tolist(), picked.tolist()


def _pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """Zero-pad ``t`` on the left of ``dim`` up to ``length``."""
    missing = length - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def merge_batches(parts: Sequence[RunningBatch]) -> RunningBatch:
    """Stack batches along the batch dim, left-padding shorter caches so rows stay right-aligned."""
    if len(parts) == 1:
        return parts[0]
    length = max(p.attention_mask.shape[1] for p in parts)
    cache = parts[0].cache
    for i, layer in enumerate(cache.layers):
        layer.keys = torch.cat([_pad_left(p.cache.layers[i].keys, length, 2) for p in parts], dim=0)
        layer.values = torch.cat([_pad_left(p.cache.layers[i].values, length, 2) for p in parts], dim=0)
    return RunningBatch(
        requests=[r for p in parts for r in p.requests],
        cache=cache,
        attention_mask=torch.cat([_pad_left(p.attention_mask, length, 1) for p in parts], dim=0),
        next_ids=torch.cat([p.next_ids for p in parts]),
    )


def keep_rows(batch: RunningBatch, rows: list[int]) -> RunningBatch | None:
    """The batch restricted to ``rows``, with columns that are padding in every row trimmed."""
    if not rows:
        return None
    if len(rows) == len(batch.requests):
        return batch
    index = torch.tensor(rows)
    mask = batch.attention_mask[index]  # [B', T]
    start = int(torch.nonzero(mask.sum(0))[0])  # first column holding a token of some row
    for layer in batch.cache.layers:
        layer.keys = layer.keys[index, :, start:]
        layer.values = layer.values[index, :, start:]
    return RunningBatch([batch.requests[i] for i in rows], batch.cache, mask[:, start:], batch.next_ids[index])
