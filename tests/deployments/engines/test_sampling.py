"""Pure tests of HFEngine's per-row sampling and batch-cache bookkeeping, and of the vLLM translations."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agents.records import SamplingParams
from deployments.engines.hf_batch import (
    GrowingLayer,
    RequestState,
    RunningBatch,
    _filtered_probs,
    keep_rows,
    merge_batches,
    sample_next,
)
from deployments.engines.vllm_engine import split_vllm_kwargs, to_vllm_sampling


def _request(sampling: SamplingParams, seed: int = 0) -> RequestState:
    return RequestState("r", [1], sampling, frozenset(), torch.Generator().manual_seed(seed), future=None)


@pytest.mark.unit
def test_top_k_keeps_the_k_largest_logits() -> None:
    probs = _filtered_probs(torch.tensor([0.0, 1.0, 2.0, 3.0]), SamplingParams(top_k=2))
    e2, e3 = math.exp(2), math.exp(3)
    assert probs.tolist() == pytest.approx([0.0, 0.0, e2 / (e2 + e3), e3 / (e2 + e3)])


@pytest.mark.unit
def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    # 0.5 < 0.6 so the second token stays; 0.5 + 0.3 >= 0.6 so the third goes
    assert _filtered_probs(logits, SamplingParams(top_p=0.6)).tolist() == pytest.approx([0.625, 0.375, 0.0])
    # the tokens above the second already reach 0.5: only the top one stays
    assert _filtered_probs(logits, SamplingParams(top_p=0.5)).tolist() == pytest.approx([1.0, 0.0, 0.0])


@pytest.mark.unit
def test_temperature_scales_logits() -> None:
    probs = _filtered_probs(torch.tensor([0.0, math.log(2.0)]), SamplingParams(temperature=0.5))
    assert probs.tolist() == pytest.approx([0.2, 0.8])  # logits become [0, 2 ln 2]: weights 1 : 4


@pytest.mark.unit
def test_sample_next_returns_raw_model_logprobs_whatever_the_temperature() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [1.0, 3.0, 2.0]])
    requests = [_request(SamplingParams(temperature=0.0)), _request(SamplingParams(temperature=2.0, top_k=1))]
    tokens, logprobs = sample_next(logits, requests)
    raw = 3.0 - math.log(math.exp(1) + math.exp(3) + math.exp(2))
    assert tokens == [1, 1]  # greedy, and top_k=1 leaves only the argmax
    assert logprobs == pytest.approx([raw, raw])


@pytest.mark.unit
def test_sample_next_is_reproducible_per_seed() -> None:
    logits = torch.zeros(1, 50)
    draws = [sample_next(logits, [_request(SamplingParams(), seed=s)])[0][0] for s in (3, 3, 4, 5, 6)]
    assert draws[0] == draws[1]
    assert len(set(draws[1:])) > 1  # four seeds over 50 equally likely tokens do not all agree


def _batch(lengths: list[int], t: int, tag: float, layer: type = DynamicLayer) -> RunningBatch:
    """A one-layer batch whose rows hold ``lengths`` real tokens right-aligned in ``t`` columns."""
    cache = DynamicCache()
    cache.layers = [layer()]
    keys = torch.full((len(lengths), 1, t, 2), tag)  # [B, H, T, D]
    cache.update(keys, keys.clone(), 0)
    mask = torch.tensor([[0] * (t - n) + [1] * n for n in lengths])
    return RunningBatch([_request(SamplingParams()) for _ in lengths], cache, mask, torch.tensor(lengths))


@pytest.mark.unit
@pytest.mark.parametrize("layer", [DynamicLayer, GrowingLayer])
def test_merge_left_pads_shorter_caches_and_keep_rows_trims_padding(layer: type) -> None:
    merged = merge_batches([_batch([3], 3, 1.0, layer), _batch([2, 1], 2, 2.0, layer)])
    assert merged.cache.layers[0].values[:, 0, :, 0].tolist() == [[1, 1, 1], [0, 2, 2], [0, 2, 2]]
    assert merged.attention_mask.tolist() == [[1, 1, 1], [0, 1, 1], [0, 0, 1]]
    assert merged.cache.layers[0].keys[:, 0, :, 0].tolist() == [[1, 1, 1], [0, 2, 2], [0, 2, 2]]
    assert merged.next_ids.tolist() == [3, 2, 1]
    kept = keep_rows(merged, [1, 2])
    assert kept.attention_mask.tolist() == [[1, 1], [0, 1]]  # column 0 was padding in both rows
    assert kept.cache.layers[0].keys.shape == (2, 1, 2, 2)
    assert kept.next_ids.tolist() == [2, 1]
    assert keep_rows(kept, []) is None


@pytest.mark.unit
def test_growing_layer_appends_in_place_and_equals_dynamic_layer() -> None:
    torch.manual_seed(0)
    growing, dynamic = GrowingLayer(), DynamicLayer()
    steps = [torch.randn(3, 2, 5, 4)] + [torch.randn(3, 2, 1, 4) for _ in range(400)]  # prefill, then decode
    moved = 0
    for new in steps:
        before = growing._buffers["keys"]
        keys, values = growing.update(new, new * 2)
        ref_keys, ref_values = dynamic.update(new, new * 2)
        assert torch.equal(keys, ref_keys) and torch.equal(values, ref_values)
        moved += before is not None and growing._buffers["keys"] is not before
    assert growing.get_seq_length() == 405
    assert moved == 1  # one reallocation past the first 261 columns of room, not one copy per step


@pytest.mark.unit
def test_vllm_kwargs_split_server_options_from_engine_args() -> None:
    engine, server = split_vllm_kwargs(
        {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "max_model_len": 512,
         "gpu_memory_utilization": 0.5, "num_gpu_blocks_override": 64, "enforce_eager": True}
    )
    assert server == {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    assert engine == {"max_model_len": 512, "gpu_memory_utilization": 0.5, "num_gpu_blocks_override": 64,
                      "enforce_eager": True}


@pytest.mark.unit
def test_vllm_sampling_translation() -> None:
    kwargs = to_vllm_sampling(SamplingParams(temperature=0.7, top_p=0.9, top_k=-1, max_new_tokens=5,
                                             stop_token_ids=(4, 9), seed=11))
    assert kwargs == {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "max_tokens": 5, "stop_token_ids": [4, 9],
                      "seed": 11, "logprobs": 0, "detokenize": False}


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
def test_a_json_schema_becomes_vllms_structured_output() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    kwargs = to_vllm_sampling(SamplingParams(json_schema=json.dumps(schema)))
    assert kwargs["structured_outputs"].json == schema
    with pytest.raises(ValueError, match="request 'r1': constrained decoding \\(json_schema\\) needs the vllm"):
        from deployments.engines.hf_engine import HFEngine

        asyncio.run(HFEngine.generate(object.__new__(HFEngine), [1], SamplingParams(json_schema="{}"), "r1"))


@pytest.mark.unit
def test_engine_table_does_not_import_vllm() -> None:
    # a fresh interpreter: vLLM is installed here, and other tests in this process import it
    code = "import sys; from deployments.engines import ENGINES; print(sorted(ENGINES), 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['hf', 'vllm'] False", out


@pytest.mark.unit
def test_sampled_frequencies_follow_the_filtered_distribution() -> None:
    n = 3000
    logits = torch.tensor([0.1, 0.2, 0.7]).log().repeat(n, 1)  # [n, 3]
    tokens, _ = sample_next(logits, [_request(SamplingParams(), seed=s) for s in range(n)])
    freqs = [tokens.count(t) / n for t in range(3)]
    assert freqs == pytest.approx([0.1, 0.2, 0.7], abs=0.03)
    top2, _ = sample_next(logits, [_request(SamplingParams(top_k=2), seed=s) for s in range(n)])
    assert top2.count(0) == 0  # filtered out: never drawn
    assert top2.count(2) / n == pytest.approx(0.7 / 0.9, abs=0.03)


@pytest.mark.unit
def test_a_rows_draw_does_not_depend_on_its_batch_mates() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    alone, _ = sample_next(logits[2:], [_request(SamplingParams(), seed=9)])
    together, _ = sample_next(logits, [_request(SamplingParams(temperature=0.0)),
                                       _request(SamplingParams(top_p=0.5), seed=1),
                                       _request(SamplingParams(), seed=9)])
    assert together[2] == alone[0]
