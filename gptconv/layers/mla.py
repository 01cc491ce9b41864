"""Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash): keys and values are made
from one small latent per position, and the cache holds that latent, not the heads' keys and values.

Per position: x (d) → the latent c = norm(kv_a(x)[:r]) (r = kv_lora_rank) and one rotated key part
k_rot = RoPE(kv_a(x)[r:]) (rope dims, shared by every head). Each head's key is [k_nope; k_rot] and its value
v, read off the latent by k_b (r → heads × nope) and v_b (r → heads × v): HF's kv_b_proj split by head, as
llama.cpp stores it. Queries: x → q_a (d → q_lora_rank) → norm → q_b (→ heads × (nope + rope)), or one
projection where q_lora_rank is 0; each head's [q_nope; q_rot], q_rot rotated. Attention as usual (its scale:
``MLAShape.scale``), then o (heads × v → d).

The cache stores c and k_rot: kv_lora_rank + rope values per position for all heads together (DeepSeek-V3:
576), where a full cache would store heads × (nope + rope + v) (128 × 320 = 40,960). Keys and values are
expanded from it each step.

RoPE here rotates halves, as everywhere in gptconv; the releases' q_b and kv_a rows of the rotated part come
in interleaved pairs (``rope_interleave``), which the key tables reorder (``families/deepseek_v3.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from .attention import causal_attention
from .kv_cache import LayerKV
from .linear import Linear
from .rope import rope


@dataclass(frozen=True)
class MLAShape:
    """The sizes of a multi-head latent attention layer."""

    kv_lora_rank: int  # the latent's width
    qk_nope_dim: int  # each head's key and query dims without RoPE
    qk_rope_dim: int  # … and with (the rotated key part is shared by the heads)
    v_head_dim: int  # each head's value
    q_lora_rank: int = 0  # the queries' own low-rank step (0: one projection)
    scale: float = 0.0  # the scores' scale (0 → (nope + rope)^-½; DeepSeek's YaRN multiplies it by mscale²)
    norm_eps: float = 0.0  # the latents' RMSNorms' epsilon (0 → the model's; transformers fixes it at 1e-6)

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"):
            if not 0 < getattr(self, name) <= 1 << 16:
                raise ValueError(f"MLA {name} = {getattr(self, name)} out of range")
        if not 0 <= self.q_lora_rank <= 1 << 16 or self.qk_rope_dim % 2:
            raise ValueError(f"MLA q_lora_rank {self.q_lora_rank} / qk_rope_dim {self.qk_rope_dim} (even) out of range")
        if not 0 <= self.scale < 1e6 or not 0 <= self.norm_eps < 1:
            raise ValueError(f"MLA scale {self.scale!r} / norm_eps {self.norm_eps!r} out of range")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim


class MLAttention(nn.Module):
    """Multi-head latent attention (the module docstring): ``norm`` makes the latents' RMSNorms, ``bias`` the
    biases of q_a, kv_a and o where the config has them."""

    def __init__(self, d_model: int, n_heads: int, shape: MLAShape, norm: Callable[[int], nn.Module],
                 bias: bool = False) -> None:
        super().__init__()
        s = self.shape = shape
        self.n_heads = n_heads
        q_out = n_heads * s.qk_head_dim
        if s.q_lora_rank:
            self.q_a, self.q_a_norm = Linear(d_model, s.q_lora_rank, bias=bias), norm(s.q_lora_rank)
            self.q_b = Linear(s.q_lora_rank, q_out, bias=False)
        else:
            self.q = Linear(d_model, q_out, bias=False)
        self.kv_a = Linear(d_model, s.kv_lora_rank + s.qk_rope_dim, bias=bias)
        self.kv_a_norm = norm(s.kv_lora_rank)
        self.k_b = Linear(s.kv_lora_rank, n_heads * s.qk_nope_dim, bias=False)  # HF's kv_b_proj, split by head
        self.v_b = Linear(s.kv_lora_rank, n_heads * s.v_head_dim, bias=False)   # as llama.cpp's k_b / v_b
        self.o = Linear(n_heads * s.v_head_dim, d_model, bias=bias)
        self.scale = s.scale or s.qk_head_dim ** -0.5
        self.window = None

    def make_state(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device,
                   reserve: int | None) -> LayerKV:
        """This layer's slot: the latent (one "head" of kv_lora_rank) as keys, the rotated key part as values."""
        s = self.shape
        return LayerKV(batch, 1, s.kv_lora_rank, max_len, dtype, device, reserve, v_dim=s.qk_rope_dim)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        """(B, T, d) → (B, T, d) at ``step`` (its cos and sin are the rotated part's angles)."""
        B, T, _ = x.shape
        s, h = self.shape, self.n_heads
        q = self.q_b(self.q_a_norm(self.q_a(x))) if s.q_lora_rank else self.q(x)       # (B, T, h·(nope + rope))
        q = q.view(B, T, h, s.qk_head_dim).transpose(1, 2)                             # (B, h, T, nope + rope)
        q_nope, q_rot = q.split((s.qk_nope_dim, s.qk_rope_dim), -1)
        latent, k_rot = self.kv_a(x).split((s.kv_lora_rank, s.qk_rope_dim), -1)        # (B, T, r), (B, T, rope)
        latent = self.kv_a_norm(latent)[:, None]                                        # (B, 1, T, r)
        step.tap("latent", latent)
        q_rot, k_rot = rope(q_rot, step.cos, step.sin), rope(k_rot[:, None], step.cos, step.sin)  # position enters
        if step.cache is not None:
            latent, k_rot = step.cache.update(step.layer, latent, k_rot)                # (B, 1, past + T, r / rope)
        k_nope = self.k_b(latent[:, 0]).view(B, -1, h, s.qk_nope_dim).transpose(1, 2)   # (B, h, N, nope)
        v = self.v_b(latent[:, 0]).view(B, -1, h, s.v_head_dim).transpose(1, 2)         # (B, h, N, v)
        k = torch.cat((k_nope, k_rot.expand(B, h, -1, -1)), -1)                         # (B, h, N, nope + rope)
        q = torch.cat((q_nope, q_rot), -1)                                              # (B, h, T, nope + rope)
        y = causal_attention(q, k, v, k.size(2) - T, 0.0, None, self.scale, step.pad)   # (B, h, T, v)
        return self.o(y.transpose(1, 2).reshape(B, T, h * s.v_head_dim))
