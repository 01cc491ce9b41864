"""Attention: the one attention layer of the RoPE families (``Attention``), causal scaled dot-product
attention over (optionally cached) keys and values, and the padding of a batch whose sequences differ
in length."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .kv_cache import LayerKV
from .linear import Linear
from .config_checks import check_range, check_sizes
from .rope import rope


@dataclass(frozen=True)
class AttentionOptions:
    """What a family varies in a decoder's attention: biases on q, k, v (``qkv_bias``) and on the output
    (``o_bias``); RMSNorm on q and k before RoPE (``qk_norm``), on each head (``qk_norm_over`` "head",
    Qwen3) or over the whole projection ("all", OLMo 2); the output × sigmoid(gate(x)) before its
    projection (``gate``, Qwen3-Next); a learned logit per head joining the softmax (``sinks``, gpt-oss);
    dropout on the weights in train mode only; and ``window``: the last positions a sliding layer attends
    to (every layer, or those the model's layer types say; None: none slides)."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    qk_norm_over: str = "head"
    gate: bool = False
    sinks: bool = False
    dropout: float = 0.0
    window: int | None = None

    def __post_init__(self) -> None:
        try:
            check_range(self, ("dropout",), 0.0, 1.0)
            if self.window is not None:
                check_sizes(self, {"window": 1 << 24})
        except ValueError as e:
            raise ValueError(f"attention: {e}") from None
        if self.qk_norm_over not in ("head", "all"):
            raise ValueError(f"attention: qk_norm_over '{self.qk_norm_over}' unknown (head, all)")


class Padding:
    """A batch with pad tokens (``attention_mask`` 0), left or right: each query's position in its own
    sequence (real tokens before it), and for every key this step sees whether it is a real token and
    its position. A real token then sees exactly what it would see alone: real keys of its sequence,
    causal, within the window counted in positions; a pad sees only its own key (its output is unused).

    positions: (B, T); key_mask, key_positions: (B, N), N = past + T (the cache's keys, then the step's).
    """

    def __init__(self, positions: torch.Tensor, key_mask: torch.Tensor, key_positions: torch.Tensor) -> None:
        self.positions, self.key_mask, self.key_positions = positions, key_mask, key_positions
        self._masks: dict[int | None, torch.Tensor] = {}

    @classmethod
    def of(cls, attention_mask: torch.Tensor | None, cache, batch: int, t: int, device: torch.device) -> Padding | None:
        """None when nothing is padded (the plain causal path); a cache that has seen a mask keeps it."""
        if attention_mask is None and (cache is None or cache.mask is None):
            return None
        if attention_mask is None:
            mask = torch.ones(batch, t, dtype=torch.bool, device=device)
        else:
            mask = attention_mask.to(device=device, dtype=torch.bool)
            if mask.shape != (batch, t):
                raise ValueError(f"attention_mask has shape {tuple(mask.shape)}; the ids have {(batch, t)}")
        if cache is not None:
            return cls(*cache.pad_step(mask))
        positions = (mask.long().cumsum(1) - 1).clamp_min(0)      # (B, T): real tokens before each one
        return cls(positions, mask, positions)

    @staticmethod
    def reach(pad: Padding | None, start: int, t: int) -> int:
        """Positions a step reaches (what the model's context must hold): start + t, or with padding
        the longest sequence's."""
        return start + t if pad is None else int(pad.positions.max()) + 1

    @staticmethod
    def positions_of(pad: Padding | None) -> torch.Tensor | None:
        return None if pad is None else pad.positions

    def mask(self, window: int | None) -> torch.Tensor:
        """(B, 1, T, N) booleans: True where a query may see a key."""
        if window not in self._masks:
            n, t = self.key_mask.size(1), self.positions.size(1)
            rows = torch.arange(n - t, n, device=self.key_mask.device)[:, None]
            cols = torch.arange(n, device=self.key_mask.device)[None, :]
            visible = self.key_mask[:, None, :] & (cols <= rows)    # (B, T, N): real keys, causal
            if window is not None:                                  # within the window, in positions
                visible &= self.positions[:, :, None] - self.key_positions[:, None, :] < window
            self._masks[window] = (visible | (cols == rows))[:, None]  # every row sees its own key
        return self._masks[window]


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past: int = 0,
    dropout_p: float = 0.0,
    window: int | None = None,
    scale: float | None = None,
    padding: Padding | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v, with torch's fused kernel (scale defaults to 1/√hd).

    q: (B, n_heads, T, hd); k, v: (B, n_kv_heads, past + T, hd): the last T keys are the queries'
    own positions, the ``past`` before them come from the KV cache. Causal: query i sees keys up to
    its own position. ``window`` (sliding-window attention, Mistral's and Gemma's local layers): it
    sees only the last ``window`` positions, its own included (key j with i − j < window, as
    transformers and llama.cpp count). When n_kv_heads < n_heads (GQA) each K/V head serves
    n_heads / n_kv_heads query heads (torch's ``enable_gqa`` is ``repeat_kv`` without the copy).
    With ``padding`` (a batch with pad tokens) its mask says what each query sees. ``softcap`` (Gemma 2):
    scores become softcap · tanh(scores / softcap) before the mask, which torch's fused kernel cannot do.
    ``sinks`` (gpt-oss): a learned logit per head, (n_heads,), that joins each query's softmax as one more
    key with no value: the weights of the real keys sum to less than 1, and attending to nothing is possible.
    """
    gqa = k.size(1) != q.size(1)
    t, n = q.size(2), k.size(2)
    if softcap is not None or sinks is not None:
        visible = padding.mask(window) if padding is not None else attention_mask(t, n - t, window, q.device)
        return spelled_attention(q, k, v, visible, scale, dropout_p, softcap, sinks)
    kw = dict(dropout_p=dropout_p, enable_gqa=gqa, scale=scale)
    if padding is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=padding.mask(window), **kw)
    if window is not None and window >= n:
        window = None  # every key is within the window: plain causal attention
    if window is None and past == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
    if window is None and t == 1:  # one new query sees every stored key: no mask needed
        return F.scaled_dot_product_attention(q, k, v, **kw)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(t, past, window, q.device), **kw)


def spelled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float | None,
                      dropout_p: float, softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(cap · tanh(q kᵀ · scale / cap) + mask) v, spelled out where torch's fused kernel cannot do it:
    a soft cap on the scores (Gemma 2), a sink logit per head (gpt-oss) joining the softmax and dropped after
    it. The softmax in float32, as HF's eager attention. ``visible``: (…, T, N) booleans."""
    group = q.size(1) // k.size(1)
    if group > 1:  # GQA: each K/V head serves ``group`` query heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * (q.size(-1) ** -0.5 if scale is None else scale)  # (B, h, T, N)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:                                       # (B, h, T, N + 1): the sink is one more column
        sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat((scores, sink), -1), dim=-1, dtype=torch.float32)[..., :-1].to(q.dtype)
    else:
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if dropout_p:
        weights = torch.nn.functional.dropout(weights, dropout_p)
    return weights @ v


def attention_mask(t: int, past: int, window: int | None, device: torch.device) -> torch.Tensor:
    """(t, past + t) booleans, True where query i (at key index past + i) may see key j."""
    rows = torch.arange(past, past + t, device=device)[:, None]
    cols = torch.arange(past + t, device=device)[None, :]
    visible = cols <= rows
    if window is not None:
        visible &= rows - cols < window
    return visible


class Attention(nn.Module):
    """Grouped-query attention with RoPE: q, k, v projections (n_kv_heads ≤ n_heads K/V heads, each shared
    by n_heads / n_kv_heads query heads), an optional norm on each q and k head before RoPE, the cache,
    causal attention within an optional ``window``, scores × ``scale`` (None: head_dim^-½), the output
    projection. What a family varies is what it passes: biases, the head norm (``qk_norm``: a norm
    module's class; ``qk_norm_over`` "head": built for head_dim and shared by the heads, "all": over the
    whole projection, before it is split into heads, as OLMo 2), the window of this layer, whether it
    rotates at all (``rope`` False: a NoPE layer, SmolLM3's every 4th), the scale, a soft cap on scores, an
    output gate (``gate``: the heads' output × sigmoid(gate(x)) before the output projection, Qwen3-Next), and
    attention sinks (``sinks``: a learned logit per head in the softmax, gpt-oss)."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, *, qkv_bias: bool = False,
                 o_bias: bool = False, qk_norm: Callable[[int], nn.Module] | None = None, qk_norm_over: str = "head",
                 window: int | None = None, rope: bool = True, scale: float | None = None, softcap: float | None = None,
                 gate: bool = False, sinks: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q = Linear(d_model, n_heads * head_dim, bias=qkv_bias)
        self.k = Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)
        self.v = Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)
        self.o = Linear(n_heads * head_dim, d_model, bias=o_bias)
        self.gate = Linear(d_model, n_heads * head_dim, bias=qkv_bias) if gate else None
        if qk_norm_over not in ("head", "all"):
            raise ValueError(f"qk_norm_over '{qk_norm_over}': 'head' or 'all'")
        self.qk_norm_over = qk_norm_over
        whole = qk_norm_over == "all"
        self.q_norm = qk_norm(n_heads * head_dim if whole else head_dim) if qk_norm else None
        self.k_norm = qk_norm(n_kv_heads * head_dim if whole else head_dim) if qk_norm else None
        self.window, self.rope, self.scale, self.softcap, self.dropout = window, rope, scale, softcap, dropout
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None  # (h,): each head's sink logit

    def make_state(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device,
                   reserve: int | None) -> LayerKV:
        """This layer's slot in the cache: its keys and values, within its window."""
        return LayerKV(batch, self.n_kv_heads, self.head_dim, max_len, dtype, device, reserve, self.window)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        """(B, T, d) → (B, T, d) at ``step`` (a ``layers.step.Step`` at this layer: angles, cache, padding, tap)."""
        B, T, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)                  # (B, T, h·hd), (B, T, h_kv·hd) twice
        if self.q_norm is not None and self.qk_norm_over == "all":
            q, k = self.q_norm(q), self.k_norm(k)                   # the whole projection normed
            step.tap("q_norm", q)                                   # (B, T, h·hd)
            step.tap("k_norm", k)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)     # (B, h, T, hd)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, T, hd)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, T, hd)
        if self.q_norm is not None and self.qk_norm_over == "head":
            q, k = self.q_norm(q), self.k_norm(k)                   # each head normed
            step.tap("q_norm", q)                                   # (B, h, T, hd)
            step.tap("k_norm", k)
        if self.rope:  # position enters here, and only here (a NoPE layer sees order only through the mask)
            q, k = rope(q, step.cos, step.sin), rope(k, step.cos, step.sin)
        if step.cache is not None:
            k, v = step.cache.update(step.layer, k, v)              # (B, h_kv, past + T, hd)
        p = self.dropout if self.training else 0.0
        # (B, h, T, hd): GQA shares K/V
        y = causal_attention(q, k, v, k.size(2) - T, p, self.window, self.scale, step.pad, self.softcap, self.sinks)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, h·hd)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x))                     # each output gated by the input
            step.tap("attention_gate", y)
        return self.o(y)
