"""Gemma 3 (text): Llama's trace with Gemma's changes.

The embedding is scaled by √d; every block norms both sides of each sublayer ("sandwich" norms:
the sublayer's output is normed again before the residual add); RMSNorm multiplies by (1 + w), so a
zero weight is the identity; q and k are RMS-normed per head before RoPE (as Qwen3); the MLP is
GeGLU with tanh-approximate GELU; attention scores are scaled by query_pre_attn_scalar^-½, not
head_dim^-½. Layers are local (sliding window, RoPE base 10k) or global (every position, RoPE base
1M, linear scaling on the 4B and larger), five local to one global in the released models. The head
is the embedding. Gemma 2's final logit soft-capping is implemented where a config sets it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import GptconvError
from .attention import Padding, causal_attention
from .config_checks import check_range, check_rope_heads, check_sizes
from .kv_cache import KVCache
from .linear import Linear, linear
from .rope import RopeScaling, rope, rope_angles, rope_frequencies
from .tap import Tap, no_tap

SLIDING, FULL = "sliding_attention", "full_attention"  # HF's layer_types


def default_layer_types(n_layers: int, pattern: int = 6) -> tuple[str, ...]:
    """Every ``pattern``-th layer global, the others local (transformers' and llama.cpp's default)."""
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n_layers))


@dataclass(frozen=True)
class Gemma3Config:
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
    attention_dropout: float = 0.0  # on the attention weights, in train mode only
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    arch = "gemma3"

    def __post_init__(self) -> None:
        check_sizes(self, {"vocab_size": 10_000_000, "context_length": 1 << 24, "d_model": 1 << 16,
                           "n_layers": 1024, "n_heads": 1024, "n_kv_heads": 1024, "d_ff": 1 << 20,
                           "head_dim": 4096, "sliding_window": 1 << 24})
        check_range(self, ("norm_eps",), 0.0, 1.0, low_open=True)
        check_range(self, ("rope_theta", "rope_local_theta"), 0.0, 1e12, low_open=True)
        check_range(self, ("query_pre_attn_scalar",), 0.0, 1e9, low_open=True)
        check_range(self, ("attention_dropout",), 0.0, 1.0)
        if self.final_logit_softcapping is not None:
            check_range(self, ("final_logit_softcapping",), 0.0, 1e9, low_open=True)
        check_rope_heads(self)
        types = tuple(self.layer_types) or default_layer_types(self.n_layers)
        if len(types) != self.n_layers or any(t not in (SLIDING, FULL) for t in types):
            raise ValueError(f"layer_types must give '{SLIDING}' or '{FULL}' for each of the {self.n_layers} layers")
        object.__setattr__(self, "layer_types", types)


# The published configs (config.json of each google/gemma-3-*-pt repository; 4b: its text_config)
PRESETS: dict[str, Gemma3Config] = {
    "gemma-3-270m": Gemma3Config(vocab_size=262144, context_length=32768, d_model=640, n_layers=18, n_heads=4,
                                 n_kv_heads=1, d_ff=2048, head_dim=256, sliding_window=512,
                                 layer_types=default_layer_types(18), query_pre_attn_scalar=256.0,
                                 rope_theta=1_000_000.0, rope_local_theta=10_000.0, bos_token_id=2, eos_token_id=1),
    "gemma-3-1b": Gemma3Config(vocab_size=262144, context_length=32768, d_model=1152, n_layers=26, n_heads=4,
                               n_kv_heads=1, d_ff=6912, head_dim=256, sliding_window=512,
                               layer_types=default_layer_types(26), query_pre_attn_scalar=256.0,
                               rope_theta=1_000_000.0, rope_local_theta=10_000.0, bos_token_id=2, eos_token_id=1),
    "gemma-3-4b": Gemma3Config(vocab_size=262208, context_length=131072, d_model=2560, n_layers=34, n_heads=8,
                               n_kv_heads=4, d_ff=10240, head_dim=256, sliding_window=1024,
                               layer_types=default_layer_types(34), query_pre_attn_scalar=256.0,
                               rope_theta=1_000_000.0, rope_scaling=RopeScaling("linear", factor=8.0),
                               rope_local_theta=10_000.0, bos_token_id=2, eos_token_id=1),
}


class Gemma3(nn.Module):
    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm_f = RMSNorm(config.d_model, config.norm_eps)
        self._inv_freq: dict[tuple[str, torch.device], torch.Tensor] = {}

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None, last_only: bool = False, tap: Tap = no_tap,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) → logits (B, T, V), or (B, 1, V) with ``last_only``. ``attention_mask``
        (B, T), 0 at pad tokens (left or right): each sequence gets the logits it gets alone."""
        c = self.config
        B, T = ids.shape
        start = cache.pos if cache is not None else 0
        pad = Padding.of(attention_mask, cache, B, T, ids.device)   # None: nothing padded
        n = Padding.reach(pad, start, T)
        if n > c.context_length:
            raise GptconvError(f"{n} positions asked for; the model has {c.context_length}")
        # √d rounded to the weights' dtype first, as HF does (in bfloat16 √640 is 25.25, not 25.298)
        x = self.tok_emb(ids) * torch.tensor(c.d_model**0.5).to(self.tok_emb.weight.dtype)  # (B, T, d)
        tap("token_embedding", x)
        positions = Padding.positions_of(pad)
        angles = {kind: rope_angles(self.inv_freq(kind, ids.device), start, T, x.dtype, positions)  # (T, hd) each,
                  for kind in set(c.layer_types)}                        # local and global RoPE; (B, 1, T, hd) padded
        for i, block in enumerate(self.blocks):
            x = block(x, *angles[c.layer_types[i]], i, cache, tap, pad)  # (B, T, d)
            tap(f"block.{i}", x)
        if last_only:
            x = x[:, -1:]                                           # (B, 1, d): only the next token matters
        x = self.norm_f(x)                                          # (B, T, d)
        tap("final_norm", x)
        logits = linear(x, self.tok_emb.weight)                     # (B, T, V): the head is the embedding
        if c.final_logit_softcapping is not None:
            logits = soft_cap(logits, c.final_logit_softcapping)    # (B, T, V), within ±cap
        tap("logits", logits)
        return logits

    def inv_freq(self, kind: str, device: torch.device) -> torch.Tensor:
        if (kind, device) not in self._inv_freq:
            c = self.config
            theta, scaling = (c.rope_local_theta, None) if kind == SLIDING else (c.rope_theta, c.rope_scaling)
            self._inv_freq[kind, device] = rope_frequencies(c.head_dim, theta, scaling).to(device)
        return self._inv_freq[kind, device]


class Block(nn.Module):
    def __init__(self, config: Gemma3Config, layer: int) -> None:
        super().__init__()
        d, eps = config.d_model, config.norm_eps
        self.norm1, self.post_attn_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.attn = Attention(config, layer)
        self.norm2, self.post_mlp_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.mlp = GeGLU(config)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None, tap: Tap = no_tap,
                pad: Padding | None = None) -> torch.Tensor:
        inner = no_tap if tap is no_tap else (lambda name, t: tap(f"block.{layer}.{name}", t))  # steps inside
        h = self.post_attn_norm(self.attn(self.norm1(x), cos, sin, layer, cache, inner, pad))  # (B, T, d)
        inner("post_attention_norm", h)
        x = x + h
        h = self.post_mlp_norm(self.mlp(self.norm2(x)))                                   # (B, T, d)
        inner("post_feedforward_norm", h)
        return x + h


class Attention(nn.Module):
    def __init__(self, config: Gemma3Config, layer: int) -> None:
        super().__init__()
        c = config
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.q = Linear(c.d_model, c.n_heads * c.head_dim, bias=False)
        self.k = Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.v = Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.o = Linear(c.n_heads * c.head_dim, c.d_model, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps)  # per head, shared by all heads
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps)
        self.window = c.sliding_window if c.layer_types[layer] == SLIDING else None
        self.scale = c.query_pre_attn_scalar**-0.5
        self.dropout = c.attention_dropout

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None, tap: Tap = no_tap,
                pad: Padding | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)     # (B, h, T, hd)
        k = self.k(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, T, hd)
        v = self.v(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, T, hd)
        q, k = self.q_norm(q), self.k_norm(k)                      # each head RMS-normed
        tap("q_norm", q)                                            # (B, h, T, hd), as HF's q_norm gives it
        tap("k_norm", k)
        q, k = rope(q, cos, sin), rope(k, cos, sin)                # position enters here, and only here
        if cache is not None:
            k, v = cache.update(layer, k, v)                        # (B, h_kv, past + T, hd): every past position
        p = self.dropout if self.training else 0.0
        y = causal_attention(q, k, v, k.size(2) - T, p, self.window, self.scale, pad)  # (B, h, T, hd)
        return self.o(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + eps) · (1 + weight), all in float32 and rounded once at the end (as HF's
    Gemma3RMSNorm; Llama's rounds before the weight). Gemma stores each weight as its offset from 1."""
    return (F.rms_norm(x.float(), (x.size(-1),), eps=eps) * (1.0 + weight.float())).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))  # zero: the identity scale
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(x, self.weight, self.eps)


def geglu(x: torch.Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
    """down(gelu(gate(x)) ⊙ up(x)): d → d_ff → d, GELU in its tanh approximation (HF's gelu_pytorch_tanh)."""
    return down(F.gelu(gate(x), approximate="tanh") * up(x))


class GeGLU(nn.Module):
    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.gate = Linear(config.d_model, config.d_ff, bias=False)
        self.up = Linear(config.d_model, config.d_ff, bias=False)
        self.down = Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return geglu(x, self.gate, self.up, self.down)


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap · tanh(x / cap): near x for |x| ≪ cap, never past ±cap."""
    return torch.tanh(x / cap) * cap
