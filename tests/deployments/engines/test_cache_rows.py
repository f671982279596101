"""Cache rows of ``HFEngine``: copying a prefilled row to the requests sharing its prompt (``repeat_rows``), the mask
and the row split of a packed prefill (``packed_mask``, ``unpack_rows``)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from deployments.engines.hf_batch import GrowingLayer, repeat_rows, right_align

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
    cache, mask = right_align(None, padded, 2, [3, 1])
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[1, 2, 3, 4, 5], [0, 0, 1, 2, 5]]
    assert cache.layers[0].values[:, 0, :, 0].tolist() == [[-1, -2, -3, -4, -5], [0, 0, -1, -2, -5]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    step = torch.full((2, 1, 1, 1), 7.0)  # the new cache grows like any other
    assert cache.layers[0].update(step, -step)[0][:, 0, :, 0].tolist() == [[1, 2, 3, 4, 5, 7], [0, 0, 1, 2, 5, 7]]
