"""Causal scaled dot-product attention over (optionally cached) keys and values."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past: int = 0,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """softmax(q kᵀ / √hd + causal mask) v, with torch's fused kernel.

    q: (B, n_heads, T, hd); k, v: (B, n_kv_heads, past + T, hd). ``past`` positions come from
    the KV cache and are visible to every query. When n_kv_heads < n_heads (GQA) each K/V head
    serves n_heads / n_kv_heads query heads (torch's ``enable_gqa`` is ``repeat_kv`` without the copy).
    """
    gqa = k.size(1) != q.size(1)
    t = q.size(2)
    if past == 0:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa)
    if t == 1:  # one new query sees every stored key: no mask needed
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, enable_gqa=gqa)
    # a chunk after a cached prefix: query i (absolute past + i) sees keys 0 … past + i
    rows = torch.arange(past, past + t, device=q.device)[:, None]
    cols = torch.arange(past + t, device=q.device)[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=cols <= rows, dropout_p=dropout_p, enable_gqa=gqa)
