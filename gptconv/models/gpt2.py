"""GPT-2: learned positions, LayerNorm, GELU MLP, multi-head attention, tied LM head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import GptconvError
from .attention import Padding, causal_attention
from .kv_cache import KVCache
from .linear import Linear, linear
from .config_checks import check_range, check_sizes
from .tap import Tap, no_tap


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    context_length: int = 1024  # HF: n_positions, the rows of the position embedding
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072  # HF: n_inner (None there means 4 · d_model)
    norm_eps: float = 1e-5
    gelu: str = "tanh"  # "tanh" (HF gelu_new, GPT-2's own) or "none" (exact erf GELU)
    embd_dropout: float = 0.1
    attn_dropout: float = 0.1
    resid_dropout: float = 0.1
    bos_token_id: int | None = 50256
    eos_token_id: int | None = 50256

    arch = "gpt2"

    def __post_init__(self) -> None:
        check_sizes(self, {"vocab_size": 10_000_000, "context_length": 1 << 24, "d_model": 1 << 16,
                           "n_layers": 1024, "n_heads": 1024, "d_ff": 1 << 20})
        check_range(self, ("embd_dropout", "attn_dropout", "resid_dropout"), 0.0, 1.0)
        check_range(self, ("norm_eps",), 0.0, 1.0, low_open=True)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model = {self.d_model} is not a multiple of n_heads = {self.n_heads}")
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"gelu = {self.gelu!r}: only 'tanh' and 'none' exist")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_kv_heads(self) -> int:  # GPT-2 has one K/V head per query head
        return self.n_heads


PRESETS: dict[str, GPT2Config] = {
    "gpt2": GPT2Config(),
    "gpt2-medium": GPT2Config(d_model=1024, n_layers=24, n_heads=16, d_ff=4096),
    "gpt2-large": GPT2Config(d_model=1280, n_layers=36, n_heads=20, d_ff=5120),
    "gpt2-xl": GPT2Config(d_model=1600, n_layers=48, n_heads=25, d_ff=6400),
}


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.context_length, config.d_model)
        self.drop = nn.Dropout(config.embd_dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm_f = nn.LayerNorm(config.d_model, eps=config.norm_eps)

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None, last_only: bool = False, tap: Tap = no_tap,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) → logits (B, T, V), or (B, 1, V) with ``last_only``. ``attention_mask``
        (B, T), 0 at pad tokens (left or right): each sequence gets the logits it gets alone."""
        B, T = ids.shape
        start = cache.pos if cache is not None else 0
        pad = Padding.of(attention_mask, cache, B, T, ids.device)   # None: nothing padded
        n = Padding.reach(pad, start, T)
        if n > self.config.context_length:
            raise GptconvError(f"{n} positions asked for; the model has {self.config.context_length}")
        x = self.tok_emb(ids)                                       # (B, T, d)
        tap("token_embedding", x)
        positions = torch.arange(start, start + T, device=ids.device) if pad is None else pad.positions
        x = x + self.pos_emb(positions)                             # (B, T, d)
        tap("position_embedding", x)
        x = self.drop(x)
        tap("embedding_dropout", x)
        for i, block in enumerate(self.blocks):
            x = block(x, i, cache, pad)                             # (B, T, d)
            tap(f"block.{i}", x)
        if last_only:
            x = x[:, -1:]                                           # (B, 1, d): only the next token matters
        x = self.norm_f(x)                                          # (B, T, d)
        tap("final_norm", x)
        logits = linear(x, self.tok_emb.weight)                     # (B, T, V): tied head, x @ wteᵀ
        tap("logits", logits)
        return logits


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.attn = SelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, layer: int, cache: KVCache | None, pad: Padding | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), layer, cache, pad)
        return x + self.mlp(self.norm2(x))


class SelfAttention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.qkv = Linear(config.d_model, 3 * config.d_model)  # q, k, v fused, as GPT-2 stores them
        self.proj = Linear(config.d_model, config.d_model)
        self.attn_dropout = config.attn_dropout
        self.resid_drop = nn.Dropout(config.resid_dropout)

    def forward(self, x: torch.Tensor, layer: int, cache: KVCache | None, pad: Padding | None = None) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)                      # 3 × (B, T, d)
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, h, T, hd)
        if cache is not None:
            k, v = cache.update(layer, k, v)                        # (B, h, past + T, hd)
        past = k.size(2) - T
        p = self.attn_dropout if self.training else 0.0
        y = causal_attention(q, k, v, past, dropout_p=p, padding=pad)  # (B, h, T, hd)
        y = y.transpose(1, 2).reshape(B, T, d)                      # (B, T, d)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.fc = Linear(config.d_model, config.d_ff)
        self.proj = Linear(config.d_ff, config.d_model)
        self.approximate = config.gelu
        self.drop = nn.Dropout(config.resid_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))  # d → d_ff → d
