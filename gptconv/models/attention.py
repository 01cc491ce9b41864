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
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v, with torch's fused kernel (scale defaults to 1/√hd).

    q: (B, n_heads, T, hd); k, v: (B, n_kv_heads, past + T, hd): the last T keys are the queries'
    own positions, the ``past`` before them come from the KV cache. Causal: query i sees keys up to
    its own position. ``window`` (sliding-window attention, Mistral's and Gemma's local layers): it
    sees only the last ``window`` positions, its own included (key j with i − j < window, as
    transformers and llama.cpp count). When n_kv_heads < n_heads (GQA) each K/V head serves
    n_heads / n_kv_heads query heads (torch's ``enable_gqa`` is ``repeat_kv`` without the copy).
    """
    gqa = k.size(1) != q.size(1)
    t, n = q.size(2), k.size(2)
    if window is not None and window >= n:
        window = None  # every key is within the window: plain causal attention
    kw = dict(dropout_p=dropout_p, enable_gqa=gqa, scale=scale)
    if window is None and past == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
    if window is None and t == 1:  # one new query sees every stored key: no mask needed
        return F.scaled_dot_product_attention(q, k, v, **kw)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(t, past, window, q.device), **kw)


def attention_mask(t: int, past: int, window: int | None, device: torch.device) -> torch.Tensor:
    """(t, past + t) booleans, True where query i (at key index past + i) may see key j."""
    rows = torch.arange(past, past + t, device=device)[:, None]
    cols = torch.arange(past + t, device=device)[None, :]
    visible = cols <= rows
    if window is not None:
        visible &= rows - cols < window
    return visible
