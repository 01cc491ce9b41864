"""The Llama trace, the decoder most families are: GPT-2's trace with four substitutions.

No position embedding (RoPE rotates Q and K inside every attention layer), RMSNorm for LayerNorm,
a SwiGLU MLP (or routed experts) for GELU, and grouped-query attention (n_kv_heads ≤ n_heads K/V
heads, each shared by n_heads / n_kv_heads query heads). A family file (``gptconv/families/``) gives
its config's ``family`` and the options below it uses (biases, a window, q/k norms, experts); the
forward does not depend on the family.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from .attention import Attention
from .config_checks import check_range, check_rope_heads, check_sizes, refuse_training
from .kv_cache import KVCache
from .linear import Linear, linear
from .mlp import MoE, SwiGLU
from .norms import RMSNorm
from .rope import RopeScaling, rope_frequencies
from .step import Step
from .tap import Tap, no_tap


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    context_length: int  # HF: max_position_embeddings
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    head_dim: int = 0  # 0: d_model // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_embeddings: bool = False
    qkv_bias: bool = False  # biases on q, k, v
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None  # every layer attends to its last sliding_window positions
    qk_norm: bool = False  # RMSNorm on each head of q and k, before RoPE
    n_experts: int = 0  # routed experts: a router picks n_experts_used of n_experts SwiGLU MLPs per token
    n_experts_used: int = 0
    attention_dropout: float = 0.0  # on the attention weights, in train mode only
    # training-time features of the source's config that gptconv does not implement (residual dropout,
    # router jitter noise, …): inference is exact without them, train() refuses
    unsupported_in_training: tuple[str, ...] = ()
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # the family (gptconv/families/) whose formats write these weights; the math does not depend on it
    family: str = "llama"

    arch = "llama"

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.d_model // max(self.n_heads, 1))
        check_sizes(self, {"vocab_size": 10_000_000, "context_length": 1 << 24, "d_model": 1 << 16,
                           "n_layers": 1024, "n_heads": 1024, "n_kv_heads": 1024, "d_ff": 1 << 20,
                           "head_dim": 4096})
        check_range(self, ("norm_eps",), 0.0, 1.0, low_open=True)
        check_range(self, ("rope_theta",), 0.0, 1e12, low_open=True)
        check_range(self, ("attention_dropout",), 0.0, 1.0)
        check_rope_heads(self)
        if self.sliding_window is not None:
            check_sizes(self, {"sliding_window": 1 << 24})
        if self.n_experts or self.n_experts_used:
            check_sizes(self, {"n_experts": 1024, "n_experts_used": self.n_experts})


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm_f = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else Linear(config.d_model, config.vocab_size, bias=False)
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None, last_only: bool = False, tap: Tap = no_tap,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) → logits (B, T, V), or (B, 1, V) with ``last_only``. ``attention_mask``
        (B, T), 0 at pad tokens (left or right): each sequence gets the logits it gets alone."""
        step = Step.begin(ids, cache, attention_mask, tap, self.config.context_length)
        x = self.tok_emb(ids)                                       # (B, T, d): no position embedding
        tap("token_embedding", x)
        angles = step.angles(self.inv_freq(ids.device), x.dtype)   # (T, hd) each: used inside attention
        for i, block in enumerate(self.blocks):
            x = block(x, step.at(i, angles))                        # (B, T, d)
            tap(f"block.{i}", x)
        if last_only:
            x = x[:, -1:]                                           # (B, 1, d): only the next token matters
        x = self.norm_f(x)                                          # (B, T, d)
        tap("final_norm", x)
        head = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        logits = linear(x, head)                                    # (B, T, V)
        tap("logits", logits)
        return logits

    def train(self, mode: bool = True) -> Llama:
        refuse_training(self.config, mode)
        return super().train(mode)

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            c = self.config
            self._inv_freq[device] = rope_frequencies(c.head_dim, c.rope_theta, c.rope_scaling).to(device)
        return self._inv_freq[device]


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.d_model, config.norm_eps)
        c = config
        self.attn = Attention(c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, qkv_bias=c.qkv_bias, o_bias=c.o_bias,
                              qk_norm=(lambda d: RMSNorm(d, c.norm_eps)) if c.qk_norm else None,
                              window=c.sliding_window, dropout=c.attention_dropout)
        self.norm2 = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = (MoE(config.d_model, config.d_ff, config.n_experts, config.n_experts_used) if config.n_experts
                    else SwiGLU(config.d_model, config.d_ff, config.mlp_bias))

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), step)                      # (B, T, d)
        return x + self.mlp(self.norm2(x), step.tap)
