"""Grouped-query attention for ``HFEngine`` without copying the KV cache (deployments layer).

transformers' ``sdpa`` attention repeats every key/value head ``num_heads / num_kv_heads`` times
(``repeat_kv``) whenever an attention mask is given, which the engine's left-padded batches always give
on CPU: each decode step then copies the whole KV cache of every layer (measured: ``reshape`` was 40% of
a 12-row, 700-token decode on the tiny Qwen2). Here the query heads that share a KV head become extra
query rows instead, so one ``scaled_dot_product_attention`` call per layer reads the cache in place.
Registered with transformers as ``ATTENTION`` (``attn_implementation="tandem_gqa_sdpa"``), with
``sdpa``'s mask format.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "tandem_gqa_sdpa"


def gqa_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, L, D], key/value [B, K, T, D] (H = G·K), mask [B, 1, L, T] or None -> out [B, L, H, D]."""
    batch, heads, length, dim = query.shape
    kv_heads, total = key.shape[1], key.shape[2]
    if kv_heads == heads or dropout > 0.0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    group = heads // kv_heads
    # head h = k·G + g (repeat_kv's order): row g·L + l of KV head k is query head k·G + g at position l
    rows = query.reshape(batch, kv_heads, group * length, dim)  # [B, K, G·L, D]
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :total].repeat(1, 1, group, 1)  # [B, 1, G·L, T]
    elif length > 1:  # no mask given: causal over the cache, the new tokens at its end
        causal = torch.ones(length, total, dtype=torch.bool, device=query.device).tril(total - length)  # [L, T]
        mask = causal.repeat(group, 1)  # [G·L, T]
    else:
        mask = None
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, gqa_sdpa_forward)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)
