"""Llama family: GPT-2's trace with four substitutions.

No position embedding (RoPE rotates Q and K inside every attention layer), RMSNorm for
LayerNorm, a SwiGLU MLP for GELU, and grouped-query attention (n_kv_heads ≤ n_heads K/V heads,
each shared by n_heads / n_kv_heads query heads). Covers Llama 2/3/3.1/3.2, TinyLlama,
SmolLM2, Mistral and Qwen2 (q/k/v bias).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import GptconvError
from .attention import Padding, causal_attention
from .kv_cache import KVCache
from .linear import Linear, linear
from .rope import RopeScaling, rope, rope_angles, rope_frequencies
from .config_checks import check_range, check_rope_heads, check_sizes, refuse_training
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
    qkv_bias: bool = False  # Qwen2 has biases on q, k, v
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None  # Mistral v0.1, Phi-3: attention sees the last 4096 (2047) positions
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k, before RoPE
    n_experts: int = 0  # Mixtral: a router picks n_experts_used of n_experts SwiGLU MLPs per token
    n_experts_used: int = 0
    attention_dropout: float = 0.0  # on the attention weights, in train mode only
    # training-time features of the source's config that gptconv does not implement (Phi-3's resid_pdrop,
    # Mixtral's router_jitter_noise, …): inference is exact without them, train() refuses
    unsupported_in_training: tuple[str, ...] = ()
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # the HF model_type whose layout the weights are written in (phi3 fuses qkv and gate/up); the math
    # does not depend on it
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


_LLAMA31 = RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=8192)
_LLAMA32 = RopeScaling("llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=8192)

def _qwen3(d_model: int, n_layers: int, n_heads: int, d_ff: int, tie: bool) -> LlamaConfig:
    """Qwen3's dense models share all but their sizes: 8 K/V heads of 128, QK-norm, no biases."""
    return LlamaConfig(vocab_size=151936, context_length=40960, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                       n_kv_heads=8, d_ff=d_ff, head_dim=128, norm_eps=1e-6, rope_theta=1000000.0,
                       tie_embeddings=tie, qk_norm=True, bos_token_id=151643, eos_token_id=151645, family="qwen3")


PRESETS: dict[str, LlamaConfig] = {
    "llama-2-7b": LlamaConfig(vocab_size=32000, context_length=4096, d_model=4096, n_layers=32, n_heads=32,
                              n_kv_heads=32, d_ff=11008, rope_theta=10000.0, bos_token_id=1, eos_token_id=2),
    "llama-3-8b": LlamaConfig(vocab_size=128256, context_length=8192, d_model=4096, n_layers=32, n_heads=32,
                              n_kv_heads=8, d_ff=14336, rope_theta=500000.0, bos_token_id=128000,
                              eos_token_id=128001),
    "llama-3.1-8b": LlamaConfig(vocab_size=128256, context_length=131072, d_model=4096, n_layers=32,
                                n_heads=32, n_kv_heads=8, d_ff=14336, rope_theta=500000.0,
                                rope_scaling=_LLAMA31, bos_token_id=128000, eos_token_id=128001),
    "llama-3.2-1b": LlamaConfig(vocab_size=128256, context_length=131072, d_model=2048, n_layers=16,
                                n_heads=32, n_kv_heads=8, d_ff=8192, rope_theta=500000.0,
                                rope_scaling=_LLAMA32, tie_embeddings=True, head_dim=64, bos_token_id=128000,
                                eos_token_id=128001),
    "llama-3.2-3b": LlamaConfig(vocab_size=128256, context_length=131072, d_model=3072, n_layers=28,
                                n_heads=24, n_kv_heads=8, d_ff=8192, rope_theta=500000.0,
                                rope_scaling=_LLAMA32, tie_embeddings=True, head_dim=128, bos_token_id=128000,
                                eos_token_id=128001),
    "tinyllama-1.1b": LlamaConfig(vocab_size=32000, context_length=2048, d_model=2048, n_layers=22, n_heads=32,
                                  n_kv_heads=4, d_ff=5632, rope_theta=10000.0, bos_token_id=1, eos_token_id=2),
    "smollm2-135m": LlamaConfig(vocab_size=49152, context_length=8192, d_model=576, n_layers=30, n_heads=9,
                                n_kv_heads=3, d_ff=1536, rope_theta=100000.0, tie_embeddings=True,
                                bos_token_id=1, eos_token_id=2),
    "smollm2-360m": LlamaConfig(vocab_size=49152, context_length=8192, d_model=960, n_layers=32, n_heads=15,
                                n_kv_heads=5, d_ff=2560, rope_theta=100000.0, tie_embeddings=True,
                                bos_token_id=1, eos_token_id=2),
    "smollm2-1.7b": LlamaConfig(vocab_size=49152, context_length=8192, d_model=2048, n_layers=24, n_heads=32,
                                n_kv_heads=32, d_ff=8192, rope_theta=130000.0, tie_embeddings=True,
                                bos_token_id=1, eos_token_id=2),
    "mistral-7b": LlamaConfig(vocab_size=32000, context_length=32768, d_model=4096, n_layers=32, n_heads=32,
                              n_kv_heads=8, d_ff=14336, rope_theta=10000.0, sliding_window=4096,
                              bos_token_id=1, eos_token_id=2, family="mistral"),
    "qwen3-0.6b": _qwen3(d_model=1024, n_layers=28, n_heads=16, d_ff=3072, tie=True),
    "qwen3-1.7b": _qwen3(d_model=2048, n_layers=28, n_heads=16, d_ff=6144, tie=True),
    "qwen3-4b": _qwen3(d_model=2560, n_layers=36, n_heads=32, d_ff=9728, tie=True),
    "qwen3-8b": _qwen3(d_model=4096, n_layers=36, n_heads=32, d_ff=12288, tie=False),
    "phi-3-mini": LlamaConfig(vocab_size=32064, context_length=4096, d_model=3072, n_layers=32, n_heads=32,
                              n_kv_heads=32, d_ff=8192, rope_theta=10000.0, sliding_window=2047,
                              bos_token_id=1, eos_token_id=32000, family="phi3"),
    "mixtral-8x7b": LlamaConfig(vocab_size=32000, context_length=32768, d_model=4096, n_layers=32, n_heads=32,
                                n_kv_heads=8, d_ff=14336, rope_theta=1000000.0, n_experts=8, n_experts_used=2,
                                bos_token_id=1, eos_token_id=2, family="mixtral"),
    "qwen2.5-0.5b": LlamaConfig(vocab_size=151936, context_length=32768, d_model=896, n_layers=24, n_heads=14,
                                n_kv_heads=2, d_ff=4864, rope_theta=1000000.0, tie_embeddings=True,
                                qkv_bias=True, norm_eps=1e-6, bos_token_id=151643, eos_token_id=151643,
                                family="qwen2"),
}
PRESETS["mistral-7b-v0.1"] = PRESETS["mistral-7b"]


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
        B, T = ids.shape
        start = cache.pos if cache is not None else 0
        pad = Padding.of(attention_mask, cache, B, T, ids.device)   # None: nothing padded
        self._check_length(Padding.reach(pad, start, T))
        x = self.tok_emb(ids)                                       # (B, T, d): no position embedding
        tap("token_embedding", x)
        # (T, hd), or (B, 1, T, hd) when padded: used inside attention
        cos, sin = rope_angles(self.inv_freq(ids.device), start, T, x.dtype, Padding.positions_of(pad))
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, i, cache, tap, pad)              # (B, T, d)
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

    def _check_length(self, n: int) -> None:
        c = self.config
        if n > c.context_length:
            raise GptconvError(f"{n} positions asked for; the model has {c.context_length}")


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.norm2 = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MoE(config) if config.n_experts else SwiGLU(config)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None, tap: Tap = no_tap,
                pad: Padding | None = None) -> torch.Tensor:
        inner = no_tap if tap is no_tap else (lambda name, t: tap(f"block.{layer}.{name}", t))  # steps inside
        x = x + self.attn(self.norm1(x), cos, sin, layer, cache, inner, pad)
        return x + self.mlp(self.norm2(x), inner)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        c = config
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.q = Linear(c.d_model, c.n_heads * c.head_dim, bias=c.qkv_bias)
        self.k = Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v = Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o = Linear(c.n_heads * c.head_dim, c.d_model, bias=c.o_bias)
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None  # per head, shared by all heads
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None
        self.window = c.sliding_window
        self.dropout = c.attention_dropout

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None, tap: Tap = no_tap,
                pad: Padding | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)     # (B, h, T, hd)
        k = self.k(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, T, hd)
        v = self.v(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, T, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)                   # Qwen3: each head RMS-normed
            tap("q_norm", q.transpose(1, 2))                        # (B, T, h, hd), as HF's q_norm gives it
            tap("k_norm", k.transpose(1, 2))
        q, k = rope(q, cos, sin), rope(k, cos, sin)                # position enters here, and only here
        if cache is not None:
            k, v = cache.update(layer, k, v)                        # (B, h_kv, past + T, hd)
        p = self.dropout if self.training else 0.0
        y = causal_attention(q, k, v, k.size(2) - T, p, self.window, padding=pad)  # (B, h, T, hd): GQA shares K/V
        return self.o(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + eps) · weight, the mean taken in float32 (as HF and llama.cpp do)."""
    return weight * F.rms_norm(x.float(), (x.size(-1),), eps=eps).to(x.dtype)  # one fused op, same rounding


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def swiglu(x: torch.Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
    """down(silu(gate(x)) ⊙ up(x)): d → d_ff → d."""
    return down(F.silu(gate(x)) * up(x))


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate = Linear(config.d_model, config.d_ff, bias=config.mlp_bias)
        self.up = Linear(config.d_model, config.d_ff, bias=config.mlp_bias)
        self.down = Linear(config.d_ff, config.d_model, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        return swiglu(x, self.gate, self.up, self.down)


class MoE(nn.Module):
    """Mixtral's sparse MLP: a linear router scores the experts per token; the top n_experts_used
    (by softmax probability, renormalised to sum to 1) each run their SwiGLU on the token, and
    their outputs are summed with those weights."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.top_k = config.n_experts_used
        self.router = Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(config) for _ in range(config.n_experts))

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        B, T, d = x.shape
        x = x.reshape(B * T, d)                                     # (N, d): each token routed alone
        scores = self.router(x)                                     # (N, E)
        tap("router", scores)
        probs = F.softmax(scores.float(), dim=-1)                   # (N, E), in float32 as HF does
        weights, chosen = probs.topk(self.top_k, dim=-1)            # (N, k) each
        weights = weights / weights.sum(-1, keepdim=True)           # the chosen k sum to 1
        tap("chosen_experts", chosen)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)      # the tokens that chose expert e
            if token.numel():
                out.index_add_(0, token, (expert(x[token]) * weights[token, slot, None]).to(x.dtype))
        return out.view(B, T, d)
