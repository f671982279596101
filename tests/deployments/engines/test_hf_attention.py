"""The engine's grouped-query attention equals transformers' ``sdpa`` (which repeats the KV heads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from deployments.engines.hf_attention import ATTENTION

pytestmark = pytest.mark.unit


def _load(model_dir: Path, attention: str):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation=attention).eval()


@torch.no_grad()
def test_left_padded_prefill_and_cached_decode_match_sdpa(tiny_model_dir: Path) -> None:
    ref, new = _load(tiny_model_dir, "sdpa"), _load(tiny_model_dir, ATTENTION)
    assert new.config.num_key_value_heads < new.config.num_attention_heads  # the tiny model uses GQA
    torch.manual_seed(0)
    ids = torch.randint(0, new.config.vocab_size, (3, 12))  # [B, L]
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, as the engine's batches have
    mask[1, :1] = 0
    outputs = []
    for model in (ref, new):
        cache = DynamicCache(config=model.config)
        prefill = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
        step_mask = torch.cat([mask, mask.new_ones(3, 1)], dim=1)
        decode = model(input_ids=prefill[:, -1].argmax(-1, keepdim=True), attention_mask=step_mask,
                       position_ids=mask.sum(1, keepdim=True), past_key_values=cache, use_cache=True).logits
        unmasked = model(input_ids=ids).logits  # no mask: causal attention built by the function itself
        outputs.append((prefill, decode, unmasked))
    for expected, got in zip(*outputs):
        valid = expected if expected.shape[1] == 1 else expected[mask.bool()]
        valid_got = got if got.shape[1] == 1 else got[mask.bool()]
        torch.testing.assert_close(valid_got, valid, atol=1e-5, rtol=1e-5)
