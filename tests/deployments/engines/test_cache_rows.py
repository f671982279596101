"""Cache rows of ``HFEngine``: copying a prefilled row to the requests sharing its prompt (``repeat_rows``), moving a
padded prefill's rows into the running layout (``right_align``), and the stored sequences prompts start with
(``PrefixCache``, ``cache_from_prefixes``)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from deployments.engines.hf_batch import GrowingLayer, repeat_rows
from deployments.engines.hf_prefill import PrefixCache, cache_from_prefixes, right_align

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("layer", [DynamicLayer, GrowingLayer])
def test_repeated_rows_own_their_memory_and_grow_apart(layer: type) -> None:
    cache = DynamicCache()
    cache.layers = [layer()]
    prompt_keys = torch.stack([torch.full((1, 3, 2), 1.0), torch.full((1, 3, 2), 2.0)])  # [2, H=1, T=3, D=2]
    cache.update(prompt_keys, -prompt_keys, 0)
    repeat_rows(cache, torch.tensor([0, 1, 0, 0]))  # rows 0, 2, 3 share prompt 0; row 1 is prompt 1
    keys = cache.layers[0].keys
    assert keys[:, 0, :, 0].tolist() == [[1, 1, 1], [2, 2, 2], [1, 1, 1], [1, 1, 1]]
    assert keys.stride(0) > 0 and len({keys[i].data_ptr() for i in range(4)}) == 4  # no row aliases another

    # each row appends its own decode step (in place for GrowingLayer) and nothing leaks into the others
    step = torch.arange(4.0).reshape(4, 1, 1, 1).expand(4, 1, 1, 2)  # [4, 1, 1, 2]: row i appends i
    keys, values = cache.layers[0].update(step, -step)
    assert keys[:, 0, :, 0].tolist() == [[1, 1, 1, 0], [2, 2, 2, 1], [1, 1, 1, 2], [1, 1, 1, 3]]
    assert values[:, 0, :, 0].tolist() == [[-1, -1, -1, 0], [-2, -2, -2, -1], [-1, -1, -1, -2], [-1, -1, -1, -3]]
    keys[0, 0, 0, 0] = 9.0  # writing one row's prefix does not change its copies
    assert cache.layers[0].keys[:, 0, 0, 0].tolist() == [9, 2, 1, 1]



def test_right_aligned_rows_keep_the_prefix_and_their_own_positions_together() -> None:
    padded = DynamicCache()
    padded.layers = [GrowingLayer()]
    # 2 prefix positions, then row 0 has 3 own positions and row 1 has 1 (left-padded by 2): value = position + 1,
    # padding marked 99
    keys = torch.tensor([[1.0, 2, 3, 4, 5], [1, 2, 99, 99, 5]]).reshape(2, 1, 5, 1)  # [u=2, H=1, W=5, D=1]
    padded.update(keys, -keys, 0)
    cache, mask = right_align(None, padded, [2, 2], [3, 1])
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[1, 2, 3, 4, 5], [0, 0, 1, 2, 5]]
    assert cache.layers[0].values[:, 0, :, 0].tolist() == [[-1, -2, -3, -4, -5], [0, 0, -1, -2, -5]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    step = torch.full((2, 1, 1, 1), 7.0)  # the new cache grows like any other
    assert cache.layers[0].update(step, -step)[0][:, 0, :, 0].tolist() == [[1, 2, 3, 4, 5, 7], [0, 0, 1, 2, 5, 7]]


def _row_cache(tokens: list[int], heads: int = 1) -> DynamicCache:
    """A one-layer cache whose row 0 holds ``tokens`` as keys (values negated): position t's key is tokens[t]."""
    cache = DynamicCache()
    cache.layers = [GrowingLayer()]
    keys = torch.tensor(tokens, dtype=torch.float32).reshape(1, 1, -1, 1).expand(1, heads, -1, 1)
    cache.update(keys, -keys, 0)
    return cache


def test_a_finished_sequence_replaces_the_earlier_turns_it_extends_and_keeps_the_shared_prefix() -> None:
    prefixes = PrefixCache(min_tokens=3)
    system = [1, 2, 3, 4]
    turn1 = system + [10, 11, 12]
    turn2 = turn1 + [13, 14, 15]
    prefixes.store(system, _row_cache(system), 0)  # shared: several prompts start with it
    prefixes.store_finished(turn1, _row_cache([0, 0] + turn1), 0, offset=2)  # a padded row: cut from offset 2
    assert len(prefixes) == 2
    found = prefixes.lookup([turn1 + [13], system + [20], [9] * 8])
    assert [None if f is None else f.tokens for f in found] == [tuple(turn1), tuple(system), None]
    assert found[0].keys[0][0, 0, :, 0].tolist() == turn1  # the row's own positions, not the padding
    prefixes.store_finished(turn2, _row_cache(turn2), 0, offset=0)  # the episode's next turn supersedes turn 1
    assert len(prefixes) == 2 and prefixes.longest(turn1 + [13]) == len(system)
    assert prefixes.longest(turn2 + [16]) == len(turn2)
    assert prefixes.longest(turn2) == len(system)  # a stored sequence must leave a token to forward
    other = system + [30, 31]  # another episode's turn does not extend turn 2: both stay
    prefixes.store_finished(other, _row_cache(other), 0, offset=0)
    assert len(prefixes) == 3 and prefixes.longest(turn2 + [16]) == len(turn2)
    prefixes.clear()
    assert len(prefixes) == 0 and prefixes.nbytes == 0 and prefixes.longest(turn2 + [16]) == 0


def test_the_byte_budget_drops_the_least_recently_used_sequences() -> None:
    row = 2 * 4 * 8  # keys + values, float32, per position
    prefixes = PrefixCache(min_tokens=2, max_bytes=10 * row)
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]
    for tokens in (a, b):
        prefixes.store(tokens, _row_cache(tokens, heads=8), 0)
    assert prefixes.nbytes == 8 * row
    prefixes.lookup([a + [0]])  # a used: b is now the least recently used
    prefixes.store(c, _row_cache(c, heads=8), 0)
    assert prefixes.nbytes == 7 * row and prefixes.longest(b + [0]) == 0
    assert prefixes.longest(a + [0]) == 4 and prefixes.longest(c + [0]) == 3
    prefixes.store(list(range(20, 31)), _row_cache(list(range(20, 31)), heads=8), 0)  # over the whole budget: not kept
    assert prefixes.nbytes == 7 * row


def test_rows_with_different_stored_prefixes_line_up_for_one_prefill() -> None:
    prefixes = PrefixCache(min_tokens=2)
    long, short = [1, 2, 3], [7, 8]
    prefixes.store(long, _row_cache(long), 0)
    prefixes.store(short, _row_cache(short), 0)
    found = prefixes.lookup([long + [4], short + [9, 9], [5, 5]])
    cache, width = cache_from_prefixes(None, found)
    assert width == 3
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[1, 2, 3], [0, 7, 8], [0, 0, 0]]
    # the prefill appends 2 positions per row, row 0 left-padded by 1 (1 new token), row 1 and 2 by 0
    new = torch.tensor([[99, 4], [9, 9], [5, 5]], dtype=torch.float32).reshape(3, 1, 2, 1)
    cache.update(new, -new, 0)
    aligned, mask = right_align(None, cache, [3, 2, 0], [1, 2, 2])
    assert aligned.layers[0].keys[:, 0, :, 0].tolist() == [[1, 2, 3, 4], [7, 8, 9, 9], [0, 0, 5, 5]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]]
