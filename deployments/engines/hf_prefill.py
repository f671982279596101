"""Prefill for ``HFEngine``: which admitted prompts go in one forward, after which stored prefix (deployments layer).

Pure tensor code, run in the engine's worker thread:

- ``Prefiller.groups`` orders admitted prompts by the tokens left after each one's longest stored prefix and cuts
  them into forwards of at most ``PREFILL_TOKENS`` tokens, padding included (vLLM's ``max_num_batched_tokens``).
  Agent turns arrive a few at a time with every length, and a forward's fixed cost dominates on small models:
  grouping by equal length took 3x the forwards (``benchmarks/rollout_async.py``: 882 vs 288 prefill forwards in
  the async run).
- ``Prefiller.forward`` forwards one group: rows with different stored prefixes go in one batch (each row's prefix
  right-aligned by ``cache_from_prefixes``, left-padded with zeros the mask hides), the tokens after them
  left-padded to the longest, so each row's outputs are its solo forward's up to float rounding; ``right_align``
  then moves the rows into the running batch's layout. Identical prompts (a GRPO group's n samples of one prompt)
  are forwarded once and their row copied (``distinct_rows``); the forward of the distinct prompts is the same
  unpadded forward, so outputs do not change.
- ``PrefixCache`` keeps the keys and values of sequences prompts start with (vLLM's automatic prefix caching in
  spirit): the common prefix of consecutive prompts (an agent's system prompt with its tool schemas, ~200 tokens
  of every demo prompt) is cut out of a prefill's own cache (no extra forward), and each finished request's whole
  sequence is kept, so an episode's next turn forwards only its new tokens. ``Prefiller.warm`` forwards the
  common prefix of a burst of prompts once before their prefill.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache

from deployments.engines.hf_batch import GrowingLayer, growing_cache, repeat_rows

# Most tokens one prefill forward computes, padding included (vLLM's ``max_num_batched_tokens`` plays this part).
PREFILL_TOKENS = 4096


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


def distinct_rows(sequences: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """(index of the first occurrence of each distinct sequence, for each sequence its distinct row)."""
    row_of: dict[tuple[int, ...], int] = {}
    distinct: list[int] = []
    for i, sequence in enumerate(map(tuple, sequences)):
        if sequence not in row_of:
            row_of[sequence] = len(distinct)
            distinct.append(i)
    return distinct, [row_of[tuple(sequence)] for sequence in sequences]


class Prefilled(NamedTuple):
    """One forward's result: the cache [b, H, W, D] per layer, right-aligned, and its attention mask [b, W]; the
    logits of each row's last position [b, V]; tokens forwarded, tokens taken from stored prefixes, padding
    tokens forwarded."""

    cache: DynamicCache
    mask: torch.Tensor
    logits: torch.Tensor
    computed: int
    reused: int
    padding: int


class Prefiller:
    """Forwards prompts into a fresh batch cache, each after its longest sequence in ``prefixes`` (see the module
    docstring). Takes the model on each call: the engine swaps it for a ``PeftModel`` on the first adapter."""

    def __init__(self, prefixes: PrefixCache, device: torch.device) -> None:
        self.prefixes = prefixes
        self.device = device

    def groups(self, sequences: list[list[int]]) -> tuple[list[list[int]], list[_Prefix | None]]:
        """Which sequences to prefill together (indices), and each one's stored prefix (``PrefixCache.lookup``):
        ordered by the tokens left to forward after that prefix, in batches of at most ``PREFILL_TOKENS`` of them
        counting the padding to the longest (duplicates are forwarded once, so they do not count)."""
        prefixes = self.prefixes.lookup(sequences)
        rest = [len(s) - (0 if p is None else len(p.tokens)) for s, p in zip(sequences, prefixes)]
        groups: list[list[int]] = []
        group: list[int] = []
        distinct: set[tuple[int, ...]] = set()
        for i in sorted(range(len(sequences)), key=rest.__getitem__):
            key = tuple(sequences[i])
            rows = len(distinct) + (key not in distinct)
            if group and rows * rest[i] > PREFILL_TOKENS:
                groups.append(group)
                group, distinct = [], set()
            group.append(i)
            distinct.add(key)
        return groups + [group] if group else groups, prefixes

    def forward(self, model, sequences: list[list[int]], prefixes: Sequence[_Prefix | None]) -> Prefilled:
        """Forward ``sequences`` in one batch. Each distinct sequence is forwarded once (duplicates get copies of its
        cache row and logits), and each one's stored prefix (``prefixes[i]``, or None) is not forwarded again. Rows
        of equal length after equal prefixes go as they are, so each row equals its solo forward; others are
        left-padded to the longest rest, with the padding masked (a row's outputs are its solo forward's up to float
        rounding), and come back right-aligned."""
        distinct, rows = distinct_rows(sequences)
        unique = [sequences[i] for i in distinct]
        cache, width = cache_from_prefixes(model.config, [prefixes[i] for i in distinct])
        starts = [0 if prefixes[i] is None else len(prefixes[i].tokens) for i in distinct]
        lengths = [len(s) - start for s, start in zip(unique, starts)]
        pads = [max(lengths) - n for n in lengths]
        input_ids = torch.tensor([[0] * pad + s[start:] for pad, s, start in zip(pads, unique, starts)])  # [u, L]
        mask = torch.tensor([[0] * (width - start) + [1] * start + [0] * pad + [1] * n
                             for start, pad, n in zip(starts, pads, lengths)])  # [u, width + L]
        extra = {}
        if width or any(pads):  # positions count each row's own tokens, after its prefix's 0..start-1
            positions = (torch.arange(max(lengths)) - torch.tensor(pads).unsqueeze(1)).clamp(min=0)  # [u, L]
            extra["position_ids"] = (positions + torch.tensor(starts).unsqueeze(1)).to(self.device)
        out = model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                    past_key_values=cache, use_cache=True, logits_to_keep=1, **extra)
        if any(pads):
            cache, mask = right_align(model.config, cache, starts, lengths)
        for row, sequence in enumerate(unique):
            self.prefixes.remember(sequence, cache, row, offset=mask.shape[1] - len(sequence))

        logits = out.logits[:, -1]  # [u, V]
        if len(distinct) < len(sequences):
            index = torch.tensor(rows)  # [b] distinct row of each sequence
            repeat_rows(cache, index)
            logits = logits[index.to(logits.device)]  # [b, V]
            mask = mask[index]
        return Prefilled(cache, mask, logits, sum(lengths), sum(starts), sum(pads))

    def warm(self, model, prompts: list[list[int]]) -> int:
        """Prompts admitted together that share a prefix (a burst of agent prompts after one system prompt; a burst
        over several databases has one system prompt each): forward each such prefix once and store it, so each
        prompt's prefill forwards only the rest. Prompts are clustered by their sorted neighbours' common prefix of at
        least ``min_tokens``. Returns the tokens forwarded."""
        if not self.prefixes.enabled:
            return 0
        distinct = sorted({tuple(p) for p in prompts})
        clusters: list[list[tuple[int, ...]]] = []
        for prompt in distinct:
            if clusters and common_prefix([clusters[-1][-1], prompt]) >= self.prefixes.min_tokens:
                clusters[-1].append(prompt)
            else:
                clusters.append([prompt])
        forwarded = 0
        for cluster in clusters:
            if len(cluster) < 2:
                continue
            shared = min(common_prefix(cluster), min(len(p) for p in cluster) - 1)
            if shared < self.prefixes.min_tokens or self.prefixes.longest(cluster[0][:shared + 1]) >= shared:
                continue  # too short, or already stored
            tokens = list(cluster[0][:shared])
            cache = growing_cache(model.config)
            model(input_ids=torch.tensor([tokens], device=self.device), past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
            self.prefixes.store(tokens, cache, 0)
            forwarded += shared
        return forwarded
