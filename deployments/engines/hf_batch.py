"""Per-row sampling and the left-padded batch KV cache of ``HFEngine`` (deployments layer).

Pure tensor code, no event loop: ``sample_next`` samples one token per row with that row's own
settings and generator; ``merge_batches`` / ``keep_rows`` add and drop rows of a running batch whose
rows are right-aligned in one ``DynamicCache`` (shorter rows left-padded with zeros the mask hides);
``GrowingLayer`` is that cache's layer, appending a decode step's keys and values in place;
``repeat_rows`` copies a prefilled row to the requests that share its prompt. How new rows are prefilled,
and the stored prefixes they start after, is ``hf_prefill``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agents.records import FinishReason, SamplingParams


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values sit in buffers with spare room along the sequence
    dim: a decode step writes one column in place instead of ``torch.cat``-copying the whole cache (the
    copy was ~20% of a stream-mode decode step at 12 rows of several hundred tokens). ``keys``/``values``
    are views of the filled part; assigning them (``merge_batches``, ``keep_rows``) starts a new buffer."""

    def __init__(self, config: object | None = None) -> None:
        self._buffers: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        self._lengths = {"keys": 0, "values": 0}  # apart: merge_batches reads one while assigning the other
        super().__init__()

    @staticmethod
    def _room(length: int) -> int:
        return length + max(256, length // 2)

    def _view(self, name: str) -> torch.Tensor | None:
        buffer = self._buffers[name]
        return None if buffer is None else buffer[:, :, : self._lengths[name]]

    def _store(self, name: str, tensor: torch.Tensor | None) -> None:
        if tensor is None or tensor.dim() != 4:  # unset, or the empty placeholder of lazy_initialization
            self._buffers[name], self._lengths[name] = None, 0
            return
        batch, heads, length, dim = tensor.shape
        buffer = tensor.new_empty(batch, heads, self._room(length), dim)
        buffer[:, :, :length].copy_(tensor)
        self._buffers[name], self._lengths[name] = buffer, length

    keys = property(lambda self: self._view("keys"), lambda self, t: self._store("keys", t))
    values = property(lambda self: self._view("values"), lambda self, t: self._store("values", t))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._buffers["keys"] is None:
            self.keys, self.values = key_states, value_states
            return self.keys, self.values
        for name, new in (("keys", key_states), ("values", value_states)):
            buffer, start = self._buffers[name], self._lengths[name]
            end = start + new.shape[-2]
            if end > buffer.shape[2]:  # out of room: a bigger buffer, amortised over many steps
                grown = buffer.new_empty(*buffer.shape[:2], self._room(end), buffer.shape[3])
                grown[:, :, :start].copy_(buffer[:, :, :start])
                self._buffers[name] = buffer = grown
            buffer[:, :, start:end].copy_(new)
            self._lengths[name] = end
        return self.keys, self.values


def growing_cache(config) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose layers are ``GrowingLayer``s (full attention only)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


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


def repeat_rows(cache: DynamicCache, index: torch.Tensor) -> None:
    """Row ``i`` of every layer becomes old row ``index[i]`` (index [B'] -> keys/values [B', H, T, D]).

    Indexing copies, and assigning a ``GrowingLayer``'s keys/values starts a new buffer, so rows that
    repeat one source row own separate memory: appending to one in place leaves the others alone.
    """
    for layer in cache.layers:
        layer.keys = layer.keys[index.to(layer.keys.device)]
        layer.values = layer.values[index.to(layer.values.device)]


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
