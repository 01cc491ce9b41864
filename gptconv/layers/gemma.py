"""Gemma's trace (Gemma 2 and Gemma 3, text): Llama's with Gemma's changes.

The embedding is scaled by √d; every block norms both sides of each sublayer ("sandwich" norms:
the sublayer's output is normed again before the residual add); RMSNorm multiplies by (1 + w), so a
zero weight is the identity; the MLP is GeGLU with tanh-approximate GELU; attention scores are scaled
by query_pre_attn_scalar^-½, not head_dim^-½. Layers are local (sliding window) or global (every
position), each kind with its own RoPE base. The head is the embedding. What the two generations
differ by is in the config: Gemma 3 RMS-norms q and k per head before RoPE; Gemma 2 soft-caps the
attention scores and the final logits (c · tanh(x / c)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .attention import Attention
from .config_checks import MAX_LAYERS, check_range, check_rope_heads, check_sizes
from .kv_cache import KVCache
from .linear import linear
from .mlp import GeGLU
from .norms import OffsetRMSNorm
from .rope import RopeScaling, rope_frequencies
from .step import Step
from .tap import Tap, no_tap

SLIDING, FULL = "sliding_attention", "full_attention"  # HF's layer_types


def default_layer_types(n_layers: int, pattern: int = 6) -> tuple[str, ...]:
    """Every ``pattern``-th layer global, the others local (transformers' and llama.cpp's default)."""
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n_layers))


@dataclass(frozen=True)
class GemmaConfig:
    vocab_size: int
    context_length: int  # HF: max_position_embeddings
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    head_dim: int
    sliding_window: int  # local layers see their last sliding_window positions, their own included
    layer_types: tuple[str, ...] = ()  # per layer, SLIDING or FULL; () → default_layer_types
    query_pre_attn_scalar: float = 256.0  # attention scores × query_pre_attn_scalar^-½
    norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0  # global layers
    rope_scaling: RopeScaling | None = None  # global layers (linear, factor 8, on the 4B and larger)
    rope_local_theta: float = 10_000.0  # local layers, never scaled
    final_logit_softcapping: float | None = None  # Gemma 2: logits = c · tanh(logits / c); Gemma 3: None
    attn_logit_softcapping: float | None = None  # Gemma 2: scores = c · tanh(scores / c); Gemma 3: None
    qk_norm: bool = True  # Gemma 3: q and k RMS-normed per head; Gemma 2: not
    attention_dropout: float = 0.0  # on the attention weights, in train mode only
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    family: str = field(kw_only=True)  # the family (gptconv/families/) whose formats write these weights

    @property
    def arch(self) -> str:
        return self.family

    def __post_init__(self) -> None:
        check_sizes(self, {"vocab_size": 10_000_000, "context_length": 1 << 24, "d_model": 1 << 16,
                           "n_layers": MAX_LAYERS, "n_heads": 1024, "n_kv_heads": 1024, "d_ff": 1 << 20,
                           "head_dim": 4096, "sliding_window": 1 << 24})
        check_range(self, ("norm_eps",), 0.0, 1.0, low_open=True)
        check_range(self, ("rope_theta", "rope_local_theta"), 0.0, 1e12, low_open=True)
        check_range(self, ("query_pre_attn_scalar",), 0.0, 1e9, low_open=True)
        check_range(self, ("attention_dropout",), 0.0, 1.0)
        for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
            if getattr(self, cap) is not None:
                check_range(self, (cap,), 0.0, 1e9, low_open=True)
        check_rope_heads(self)
        types = tuple(self.layer_types) or default_layer_types(self.n_layers)
        if len(types) != self.n_layers or any(t not in (SLIDING, FULL) for t in types):
            raise ValueError(f"layer_types must give '{SLIDING}' or '{FULL}' for each of the {self.n_layers} layers")
        object.__setattr__(self, "layer_types", types)


class Gemma(nn.Module):
    def __init__(self, config: GemmaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm_f = OffsetRMSNorm(config.d_model, config.norm_eps)
        self._inv_freq: dict[tuple[str, torch.device], torch.Tensor] = {}

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None, last_only: bool = False, tap: Tap = no_tap,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) → logits (B, T, V), or (B, 1, V) with ``last_only``. ``attention_mask``
        (B, T), 0 at pad tokens (left or right): each sequence gets the logits it gets alone."""
        c = self.config
        step = Step.begin(ids, cache, attention_mask, tap, c.context_length)
        x = scaled_embedding(self.tok_emb, ids)                     # (B, T, d)
        tap("token_embedding", x)
        angles = {kind: step.angles(self.inv_freq(kind, ids.device), x.dtype)  # (T, hd) each: local and global
                  for kind in set(c.layer_types)}
        for i, block in enumerate(self.blocks):
            x = block(x, step.at(i, angles[c.layer_types[i]]))      # (B, T, d)
            tap(f"block.{i}", x)
        return tied_head(x, self.norm_f, self.tok_emb.weight, c.final_logit_softcapping, last_only, tap)

    def inv_freq(self, kind: str, device: torch.device) -> torch.Tensor:
        if (kind, device) not in self._inv_freq:
            c = self.config
            theta, scaling = (c.rope_local_theta, None) if kind == SLIDING else (c.rope_theta, c.rope_scaling)
            self._inv_freq[kind, device] = rope_frequencies(c.head_dim, theta, scaling).to(device)
        return self._inv_freq[kind, device]


class Block(nn.Module):
    def __init__(self, config: GemmaConfig, layer: int) -> None:
        super().__init__()
        d, eps = config.d_model, config.norm_eps
        self.norm1, self.post_attn_norm = OffsetRMSNorm(d, eps), OffsetRMSNorm(d, eps)
        c = config
        self.attn = Attention(d, c.n_heads, c.n_kv_heads, c.head_dim,
                              qk_norm=(lambda hd: OffsetRMSNorm(hd, eps)) if c.qk_norm else None,
                              window=c.sliding_window if c.layer_types[layer] == SLIDING else None,
                              scale=c.query_pre_attn_scalar**-0.5, softcap=c.attn_logit_softcapping,
                              dropout=c.attention_dropout)
        self.norm2, self.post_mlp_norm = OffsetRMSNorm(d, eps), OffsetRMSNorm(d, eps)
        self.mlp = GeGLU(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        h = self.post_attn_norm(self.attn(self.norm1(x), step))    # (B, T, d)
        step.tap("post_attention_norm", h)
        x = x + h
        h = self.post_mlp_norm(self.mlp(self.norm2(x)))             # (B, T, d)
        step.tap("post_feedforward_norm", h)
        return x + h


def scaled_embedding(emb: nn.Embedding, ids: torch.Tensor, d: int | None = None) -> torch.Tensor:
    """The ids' rows × √d (d: the rows' width unless given), √d rounded to the weights' dtype first, as HF
    does (in bfloat16 √640 is 25.25, not 25.298)."""
    d = emb.embedding_dim if d is None else d
    return emb(ids) * torch.tensor(d**0.5).to(emb.weight.dtype)


def tied_head(x: torch.Tensor, norm: nn.Module, embedding: torch.Tensor, cap: float | None, last_only: bool,
              tap: Tap) -> torch.Tensor:
    """The last blocks' output (B, T, d) → logits (B, T, V), or (B, 1, V) with ``last_only``: the final norm,
    the embedding as the head, the soft cap where there is one."""
    if last_only:
        x = x[:, -1:]                                               # (B, 1, d): only the next token matters
    x = norm(x)                                                     # (B, T, d)
    tap("final_norm", x)
    logits = linear(x, embedding)                                   # (B, T, V): the head is the embedding
    if cap is not None:
        logits = soft_cap(logits, cap)                              # (B, T, V), within ±cap
    tap("logits", logits)
    return logits


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap · tanh(x / cap): near x for |x| ≪ cap, never past ±cap."""
    return torch.tanh(x / cap) * cap
