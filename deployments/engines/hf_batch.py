"""Per-row sampling and the left-padded batch KV cache of ``HFEngine`` (deployments layer).

Pure tensor code, no event loop: ``sample_next`` samples one token per row with that row's own
settings and generator; ``merge_batches`` / ``keep_rows`` add and drop rows of a running batch whose
rows are right-aligned in one ``DynamicCache`` (shorter rows left-padded with zeros the mask hides);
``GrowingLayer`` is that cache's layer, appending a decode step's keys and values in place;
``repeat_rows`` copies a prefilled row to the requests that share its prompt; ``PrefixCache`` keeps the keys
and values of sequences prompts may start with, ``cache_from_prefixes`` lines up each row's stored prefix for a
prefill, and ``right_align`` moves the rows of that prefill (left-padded prompts) into the running layout.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
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


@dataclass(eq=False)
class _Prefix:
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]  # per layer [1, H, P, D]
    values: list[torch.Tensor]
    shared: bool  # a prefix common to several prompts (kept until evicted), else a finished request's own sequence

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys + self.values)


class PrefixCache:
    """Keys and values of recently seen token sequences, for one adapter: prefixes several prompts share (an agent's
    system prompt with the tool schemas) and the whole sequence of each finished request (a multi-turn episode's
    next prompt is its previous prompt, the response and the tool's answer, so it starts with that sequence).

    It fills itself without extra forwards: after a prefill, the common token prefix of the new prompt and the
    previous one (when at least ``min_tokens`` long) is cut out of the cache the prefill just built (a causal model's
    keys and values at position t depend only on tokens up to t); when a request finishes, its row's cache (prompt
    and response but the last token, which was never forwarded) is kept (``store_finished``), replacing the finished
    sequences it extends (that episode's earlier turns). The engine also ``store``s the common prefix of prompts
    admitted together, forwarded once, before prefilling them. ``lookup`` returns for each prompt the longest stored
    sequence it starts with that leaves at least one token to forward. ``clear`` on every adapter change: the keys
    and values depend on the weights. At most ``max_bytes`` of keys and values, least recently used out.
    """

    def __init__(self, min_tokens: int = 32, max_bytes: int = 512 * 2**20):
        self.min_tokens = min_tokens
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[int, ...], _Prefix] = OrderedDict()  # least recently used first
        # (length, last token) -> the stored sequences with both: a prompt's prefixes are looked up by these two
        # ints first, so a lookup costs a dict probe per prompt position, not a comparison per stored sequence
        self._ends: dict[tuple[int, int], set[tuple[int, ...]]] = {}
        self._bytes = 0
        self._last: tuple[int, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.min_tokens > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        self._items, self._ends, self._bytes, self._last = OrderedDict(), {}, 0, ()

    def _prefixes_of(self, tokens: Sequence[int], below: int) -> Iterator[tuple[int, ...]]:
        """The stored sequences that start ``tokens``, shorter than ``below`` tokens, longest first."""
        for n in range(min(below, len(tokens) + 1) - 1, max(self.min_tokens, 1) - 1, -1):
            ends = self._ends.get((n, tokens[n - 1]))
            if ends:
                head = tuple(tokens[:n])
                if head in ends:
                    yield head

    def _match(self, prompt: Sequence[int]) -> _Prefix | None:
        """The longest stored sequence that starts ``prompt`` and leaves it at least one token to forward."""
        if not self.enabled:
            return None
        head = next(self._prefixes_of(prompt, len(prompt)), None)
        return None if head is None else self._items[head]

    def lookup(self, prompts: Sequence[Sequence[int]]) -> list[_Prefix | None]:
        """For each prompt its longest stored sequence (``None``: none), each counted as a use."""
        found = [self._match(p) for p in prompts]
        for item in found:
            if item is not None:  # most recently used last
                self._items.move_to_end(item.tokens)
        return found

    def longest(self, prompt: Sequence[int]) -> int:
        """Length of the sequence ``lookup([prompt])`` would return (0: none), without counting it as a use."""
        best = self._match(prompt)
        return 0 if best is None else len(best.tokens)

    def remember(self, prompt: Sequence[int], cache: DynamicCache, row: int, offset: int = 0) -> None:
        """Store the prefix ``prompt`` shares with the previously remembered prompt, cut from ``cache`` row ``row``
        (whose ``len(prompt)`` positions from ``offset`` on hold ``prompt``'s keys and values)."""
        if not self.enabled:
            return
        tokens = tuple(prompt)
        previous, self._last = self._last, tokens
        common = common_prefix([tokens, previous])
        if common >= self.min_tokens:
            self.store(tokens[:common], cache, row, offset)

    def store(self, tokens: Sequence[int], cache: DynamicCache, row: int, offset: int = 0, shared: bool = True) -> None:
        """Keep ``tokens``' keys and values: ``len(tokens)`` positions of ``cache`` row ``row`` from ``offset`` on."""
        tokens = tuple(tokens)
        if not self.enabled or not tokens or tokens in self._items:
            return
        end = offset + len(tokens)
        keys = [layer.keys[row: row + 1, :, offset:end].clone() for layer in cache.layers]
        values = [layer.values[row: row + 1, :, offset:end].clone() for layer in cache.layers]
        item = _Prefix(tokens, keys, values, shared)
        if item.nbytes > self.max_bytes:
            return
        self._items[tokens] = item
        self._ends.setdefault((len(tokens), tokens[-1]), set()).add(tokens)
        self._bytes += item.nbytes
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._items)))

    def _drop(self, tokens: tuple[int, ...]) -> None:
        item = self._items.pop(tokens)
        self._bytes -= item.nbytes
        ends = self._ends[(len(tokens), tokens[-1])]
        ends.discard(tokens)
        if not ends:
            del self._ends[(len(tokens), tokens[-1])]

    def store_finished(self, tokens: Sequence[int], cache: DynamicCache, row: int, offset: int) -> None:
        """Keep a finished request's sequence (as ``store``), dropping the finished sequences it extends: a prompt
        that starts with one of those most likely continues this one."""
        tokens = tuple(tokens)
        if not self.enabled or len(tokens) < self.min_tokens:
            return
        for head in list(self._prefixes_of(tokens, len(tokens))):
            if not self._items[head].shared:
                self._drop(head)
        self.store(tokens, cache, row, offset, shared=False)


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix all ``sequences`` share."""
    first, n = sequences[0], min(len(s) for s in sequences)
    k = 0
    while k < n and all(s[k] == first[k] for s in sequences):
        k += 1
    return k


def cache_from_prefixes(config, prefixes: Sequence[_Prefix | None]) -> tuple[DynamicCache, int]:
    """A growing cache holding row i's stored sequence ``prefixes[i]`` (``None``: nothing), right-aligned and
    left-padded with zeros to the longest, ready to extend. Returns it and its width."""
    width = max(0 if p is None else len(p.tokens) for p in prefixes)
    cache = growing_cache(config)
    if width == 0:
        return cache, 0
    first = next(p for p in prefixes if p is not None)
    same = all(p is first for p in prefixes)
    cache.layers = [GrowingLayer() for _ in first.keys]
    for index, layer in enumerate(cache.layers):
        rows = []
        for stored in ([p.keys[index] if p else None for p in prefixes], [p.values[index] if p else None for p in prefixes]):
            if same:  # one stored sequence for every row: a view, copied once when the layer stores it
                rows.append(stored[0].expand(len(prefixes), -1, -1, -1))
                continue
            empty = first.keys[index][0, :, :0]  # [H, 0, D]
            # one op for all rows (each small op is a point where the engine thread may wait for the GIL)
            by_position = [(empty if t is None else t[0]).transpose(0, 1) for t in stored]  # [P_i, H, D] each
            rows.append(pad_sequence(by_position, batch_first=True, padding_side="left").transpose(1, 2))  # [u, H, P, D]
        layer.lazy_initialization(*rows)  # marks the layer initialized, so update() extends instead of resetting
        layer.keys, layer.values = rows
    return cache, width


def right_align(config, padded: DynamicCache, starts: Sequence[int], lengths: Sequence[int]) -> tuple[DynamicCache, torch.Tensor]:
    """Rows of a padded prefill's cache moved so each row's prefix and own positions are contiguous and right-aligned,
    the padding left of them as zeros (the layout ``merge_batches`` keeps and ``PrefixCache`` cuts from). In
    ``padded`` (width ``max(starts) + max(lengths)``) row i holds its ``starts[i]`` prefix positions right-aligned in
    the first ``max(starts)`` columns, then left padding, then its ``lengths[i]`` own positions. Returns the growing
    cache [u, H, W, D] per layer, W = max(starts[i] + lengths[i]), and its attention mask [u, W]."""
    prefix_width, full = max(starts), max(starts) + max(lengths)
    width = max(s + n for s, n in zip(starts, lengths))
    index = torch.full((len(lengths), width), full)  # [u, W]; ``full`` is an extra all-zero position
    for row, (start, n) in enumerate(zip(starts, lengths)):
        index[row, width - n - start: width - n] = torch.arange(prefix_width - start, prefix_width)
        index[row, width - n:] = torch.arange(full - n, full)
    cache = growing_cache(config)
    cache.layers = [GrowingLayer() for _ in padded.layers]
    for layer, source in zip(cache.layers, padded.layers):
        rows = []
        for tensor in (source.keys, source.values):  # [u, H, full, D]
            extended = torch.cat([tensor, tensor.new_zeros(*tensor.shape[:2], 1, tensor.shape[3])], dim=2)
            gather = index.to(tensor.device)[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
            rows.append(torch.gather(extended, 2, gather))  # [u, H, W, D]
        layer.lazy_initialization(*rows)
        layer.keys, layer.values = rows
    return cache, (index != full).long()
