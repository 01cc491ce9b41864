"""Gemma 4's trace (text): Gemma's (``layers/gemma.py``: √d-scaled embedding, sandwich norms, GeGLU, local and
global layers, the head the embedding) with its own changes:

- every RMSNorm scales by w (stored as itself, not Gemma 3's 1 + w), in float32 and rounded once; V is
  RMS-normed per head with no weight; q and k per head with one; attention scores are not scaled (× 1);
- global layers have heads of their own width (512 on the released models) and their own K/V head count,
  and rotate by "proportional" RoPE: the first ``global_rope_fraction`` of the frequencies of the full
  head width, the rest not at all (frequency 0, both halves of each head as rotate-half pairs them);
  local layers rotate every dimension with their own base;
- keys as values (``k_eq_v``, the large models' global layers): V is the k projection, before k's norm and
  RoPE, and there is no v projection;
- KV sharing (E2B, E4B): the last ``kv_shared_layers`` layers compute no keys or values: each attends to
  those the last unshared layer of its kind stored this step (its cache slot refers to that layer's);
  with ``double_wide_mlp`` their MLP is twice as wide;
- per-layer embeddings (PLE, E2B, E4B): a second table gives each token a vector of ``ple.dim`` per layer,
  added to a projection of the embedding; each block ends with x + norm(out(gelu(gate(x)) ⊙ that vector));
- every block's output × its ``layer_scalar``;
- the 26B-A4B's MoE block: the dense GeGLU and routed GeGLU experts run side by side on the same input,
  each normed, summed; its router scores RMS-normed (no weight) input × scale × d^-½, keeps the top k of
  the softmax, renormalises, and multiplies each by its expert's scale;
- the final logits soft-capped (c · tanh(x / c)).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import causal_attention
from .config_checks import MAX_LAYERS, check_range, check_sizes
from .gemma import FULL, SLIDING, scaled_embedding, tied_head
from .kv_cache import KVCache, LayerKV, SharedKV
from .linear import Linear
from .mlp import Experts, GeGLU, mix_experts
from .norms import F32RMSNorm as RMSNorm
from .norms import plain_rms_norm
from .rope import rope, rope_frequencies
from .step import Step
from .tap import Tap, no_tap


@dataclass(frozen=True)
class PLEShape:
    """Per-layer embeddings: each token's vector of ``dim`` for every layer, from a table of ``vocab`` rows
    (0 → the model's vocabulary)."""

    dim: int
    vocab: int = 0

    def __post_init__(self) -> None:
        try:
            check_sizes(self, {"dim": 1 << 16})
            if self.vocab:
                check_sizes(self, {"vocab": 10_000_000})
        except ValueError as e:
            raise ValueError(f"per-layer embeddings: {e}") from None


@dataclass(frozen=True)
class Gemma4Config:
    vocab_size: int
    context_length: int  # HF: max_position_embeddings
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int  # local layers'
    d_ff: int
    head_dim: int  # local layers'
    sliding_window: int
    layer_types: tuple[str, ...]  # per layer, SLIDING or FULL
    global_head_dim: int = 0  # 0 → head_dim
    global_kv_heads: int = 0  # 0 → n_kv_heads
    norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0  # global layers
    global_rope_fraction: float = 0.25  # of the global head's frequencies rotated ("proportional")
    rope_local_theta: float = 10_000.0  # local layers: all of the head rotated
    final_logit_softcapping: float | None = None
    k_eq_v: bool = False  # global layers: V is the k projection
    kv_shared_layers: int = 0  # the last ones attend to an earlier layer's keys and values
    double_wide_mlp: bool = False  # the KV-shared layers' MLP twice as wide
    ple: PLEShape | None = None  # per-layer embeddings (None: none)
    experts: Experts | None = None  # the MoE block beside the dense MLP (None: none): count, used, d_ff only
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    family: str = "gemma4"

    @property
    def arch(self) -> str:
        return self.family

    def __post_init__(self) -> None:
        if not self.global_head_dim:
            object.__setattr__(self, "global_head_dim", self.head_dim)
        if not self.global_kv_heads:
            object.__setattr__(self, "global_kv_heads", self.n_kv_heads)
        if self.ple is not None and not self.ple.vocab:
            object.__setattr__(self, "ple", replace(self.ple, vocab=self.vocab_size))
        check_sizes(self, {"vocab_size": 10_000_000, "context_length": 1 << 24, "d_model": 1 << 16,
                           "n_layers": MAX_LAYERS, "n_heads": 1024, "n_kv_heads": 1024, "d_ff": 1 << 20, "head_dim": 4096,
                           "global_head_dim": 4096, "global_kv_heads": 1024, "sliding_window": 1 << 24})
        check_range(self, ("norm_eps",), 0.0, 1.0, low_open=True)
        check_range(self, ("rope_theta", "rope_local_theta"), 0.0, 1e12, low_open=True)
        check_range(self, ("global_rope_fraction",), 0.0, 1.0)
        if self.final_logit_softcapping is not None:
            check_range(self, ("final_logit_softcapping",), 0.0, 1e9, low_open=True)
        types = tuple(self.layer_types)
        if len(types) != self.n_layers or any(t not in (SLIDING, FULL) for t in types):
            raise ValueError(f"layer_types must give '{SLIDING}' or '{FULL}' for each of the {self.n_layers} layers")
        object.__setattr__(self, "layer_types", types)
        for name, d in (("head_dim", self.head_dim), ("global_head_dim", self.global_head_dim)):
            if d % 2:
                raise ValueError(f"{name} = {d} is odd: RoPE rotates pairs")
        for name, kv in (("n_kv_heads", self.n_kv_heads), ("global_kv_heads", self.global_kv_heads)):
            if self.n_heads % kv:
                raise ValueError(f"n_heads = {self.n_heads} is not a multiple of {name} = {kv}")
        if not 0 <= self.kv_shared_layers < self.n_layers:
            raise ValueError(f"kv_shared_layers = {self.kv_shared_layers}: fewer than the {self.n_layers} layers")
        if self.kv_shared_layers:
            for i in range(self.first_shared, self.n_layers):
                self.kv_source(i)  # every shared layer has a layer of its kind before them
        if self.experts is not None and not self.experts.d_ff:  # its router is its own (``Router``): of
            raise ValueError("experts: d_ff = 0; Gemma 4's experts have a size of their own")  # Experts, these 3

    @property
    def first_shared(self) -> int:
        return self.n_layers - self.kv_shared_layers

    def is_global(self, layer: int) -> bool:
        return self.layer_types[layer] == FULL

    def head_dim_at(self, layer: int) -> int:
        return self.global_head_dim if self.is_global(layer) else self.head_dim

    def kv_heads_at(self, layer: int) -> int:
        return self.global_kv_heads if self.is_global(layer) else self.n_kv_heads

    def kv_source(self, layer: int) -> int | None:
        """The layer whose keys and values a KV-shared ``layer`` attends to (None: its own): the last layer
        of its kind before the shared ones."""
        if layer < self.first_shared:
            return None
        kind = self.layer_types[layer]
        source = next((j for j in reversed(range(self.first_shared)) if self.layer_types[j] == kind), None)
        if source is None:
            raise ValueError(f"KV-shared layer {layer} ({kind}) has no unshared {kind} layer before it")
        return source

    def d_ff_at(self, layer: int) -> int:
        return self.d_ff * (2 if self.double_wide_mlp and self.kv_source(layer) is not None else 1)


class Gemma4(nn.Module):
    def __init__(self, config: Gemma4Config) -> None:
        super().__init__()
        c = self.config = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.ple = PerLayerEmbedding(c) if c.ple is not None else None
        self.blocks = nn.ModuleList(Block(c, i) for i in range(c.n_layers))
        self.norm_f = RMSNorm(c.d_model, c.norm_eps)
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
        per_layer = self.ple(ids, x) if self.ple is not None else None  # (B, T, L, p)
        if per_layer is not None:
            tap("per_layer_embedding", per_layer)
        angles = {kind: step.angles(self.inv_freq(kind, ids.device), x.dtype) for kind in set(c.layer_types)}
        shared: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # kind → the keys, values a shared layer reuses
        for i, block in enumerate(self.blocks):
            x = block(x, step.at(i, angles[c.layer_types[i]]), shared,
                      per_layer[:, :, i] if per_layer is not None else None)  # (B, T, d)
            tap(f"block.{i}", x)
        return tied_head(x, self.norm_f, self.tok_emb.weight, c.final_logit_softcapping, last_only, tap)

    def inv_freq(self, kind: str, device: torch.device) -> torch.Tensor:
        """Local layers: every frequency of head_dim; global ones: the first fraction of global_head_dim's,
        then zeros (those dimensions are not rotated: cos 1, sin 0)."""
        if (kind, device) not in self._inv_freq:
            c = self.config
            if kind == SLIDING:
                freqs = rope_frequencies(c.head_dim, c.rope_local_theta)
            else:
                freqs = rope_frequencies(c.global_head_dim, c.rope_theta)
                freqs[int(c.global_rope_fraction * c.global_head_dim // 2):] = 0.0
            self._inv_freq[kind, device] = freqs.to(device)
        return self._inv_freq[kind, device]


class PerLayerEmbedding(nn.Module):
    """Each token's vector for every layer: (its row of ``table`` · √p + norm(proj(x) · d^-½)) · 2^-½."""

    def __init__(self, c: Gemma4Config) -> None:
        super().__init__()
        self.n_layers, self.dim = c.n_layers, c.ple.dim
        self.table = nn.Embedding(c.ple.vocab, c.n_layers * c.ple.dim)
        self.proj = Linear(c.d_model, c.n_layers * c.ple.dim, bias=False)
        self.norm = RMSNorm(c.ple.dim, c.norm_eps)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """ids (B, T), the scaled embedding x (B, T, d) → (B, T, L, p)."""
        B, T, d = x.shape
        token = scaled_embedding(self.table, ids, self.dim).view(B, T, self.n_layers, self.dim)  # × √p
        context = self.norm((self.proj(x) * d**-0.5).view(B, T, self.n_layers, self.dim))
        return (context + token) * 2**-0.5


class Attention(nn.Module):
    """Gemma 4's attention at one layer: q, k normed per head (w), v normed per head (no weight), RoPE on q
    and k, scores unscaled. ``k_eq_v``: V is the k projection; ``shared``: no keys or values of its own."""

    def __init__(self, c: Gemma4Config, layer: int) -> None:
        super().__init__()
        d, hd, kv = c.d_model, c.head_dim_at(layer), c.kv_heads_at(layer)
        self.kind, self.n_heads, self.n_kv_heads, self.head_dim = c.layer_types[layer], c.n_heads, kv, hd
        self.window = None if c.is_global(layer) else c.sliding_window
        self.source = c.kv_source(layer)
        self.q = Linear(d, c.n_heads * hd, bias=False)
        self.q_norm = RMSNorm(hd, c.norm_eps)
        own = self.source is None
        self.k = Linear(d, kv * hd, bias=False) if own else None
        self.v = Linear(d, kv * hd, bias=False) if own and not (c.k_eq_v and c.is_global(layer)) else None
        self.k_norm = RMSNorm(hd, c.norm_eps) if own else None
        self.o = Linear(c.n_heads * hd, d, bias=False)
        self.eps = c.norm_eps

    def make_state(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device,
                   reserve: int | None) -> LayerKV | SharedKV:
        """This layer's slot: its keys and values within its window, or a reference to its source's."""
        if self.source is not None:
            return SharedKV(self.source)
        return LayerKV(batch, self.n_kv_heads, self.head_dim, max_len, dtype, device, reserve, self.window)

    def forward(self, x: torch.Tensor, step: Step, shared: dict) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_norm(self.q(x).view(B, T, self.n_heads, self.head_dim))  # (B, T, h, hd)
        step.tap("q_norm", q)
        q = rope(q.transpose(1, 2), step.cos, step.sin)             # (B, h, T, hd)
        if self.source is not None:                                 # keys and values of an earlier layer
            if step.cache is not None:
                step.cache.slot(step.layer, T)                      # its turn, holding nothing of its own
            k, v = shared[self.kind]                                # (B, h_kv, past + T, hd)
        else:
            k = self.k(x).view(B, T, self.n_kv_heads, self.head_dim)           # (B, T, h_kv, hd)
            v = self.v(x).view(B, T, self.n_kv_heads, self.head_dim) if self.v is not None else k
            k = self.k_norm(k)                                                 # (B, T, h_kv, hd)
            step.tap("k_norm", k)
            v = plain_rms_norm(v, self.eps).transpose(1, 2)                    # no weight: (B, h_kv, T, hd)
            k = rope(k.transpose(1, 2), step.cos, step.sin)                    # (B, h_kv, T, hd)
            if step.cache is not None:
                k, v = step.cache.update(step.layer, k, v)          # (B, h_kv, past + T, hd)
            shared[self.kind] = (k, v)
        y = causal_attention(q, k, v, k.size(2) - T, 0.0, self.window, 1.0, step.pad)  # (B, h, T, hd)
        return self.o(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class Router(nn.Module):
    """The MoE block's router: softmax(proj(norm(x) · scale · d^-½)) → top k → renormalised → × the chosen
    experts' own scales."""

    def __init__(self, c: Gemma4Config) -> None:
        super().__init__()
        self.top_k, self.eps = c.experts.used, c.norm_eps
        self.proj = Linear(c.d_model, c.experts.count, bias=False)
        self.scale = nn.Parameter(torch.ones(c.d_model))
        self.expert_scale = nn.Parameter(torch.ones(c.experts.count))

    def forward(self, x: torch.Tensor, tap: Tap) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, d) → weights, chosen experts: (N, k) each."""
        h = plain_rms_norm(x, self.eps) * self.scale * x.size(-1) ** -0.5
        scores = self.proj(h)                                       # (N, E)
        tap("router", scores)
        weights, chosen = F.softmax(scores, dim=-1, dtype=torch.float32).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return weights * self.expert_scale[chosen], chosen


class GeGLUExperts(nn.Module):
    """The routed GeGLU experts: each chosen expert's output × its weight, summed per token."""

    def __init__(self, c: Gemma4Config) -> None:
        super().__init__()
        self.experts = nn.ModuleList(GeGLU(c.d_model, c.experts.d_ff) for _ in range(c.experts.count))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        return mix_experts(x, self.experts, weights, chosen)        # (N, d)


class Block(nn.Module):
    def __init__(self, c: Gemma4Config, layer: int) -> None:
        super().__init__()
        d, eps = c.d_model, c.norm_eps
        self.norm1, self.post_attn_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.attn = Attention(c, layer)
        self.norm2, self.post_mlp_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.mlp = GeGLU(d, c.d_ff_at(layer))
        if c.experts is not None:  # the MoE block beside the dense MLP, each with its norms
            self.post_dense_norm, self.pre_moe_norm, self.post_moe_norm = (RMSNorm(d, eps) for _ in range(3))
            self.router, self.experts = Router(c), GeGLUExperts(c)
        else:
            self.router = None
        if c.ple is not None:
            self.ple_gate = Linear(d, c.ple.dim, bias=False)
            self.ple_out = Linear(c.ple.dim, d, bias=False)
            self.ple_norm = RMSNorm(d, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor, step: Step, shared: dict, per_layer: torch.Tensor | None) -> torch.Tensor:
        h = self.post_attn_norm(self.attn(self.norm1(x), step, shared))  # (B, T, d)
        step.tap("post_attention_norm", h)
        x = x + h
        h = self.mlp(self.norm2(x))                                 # (B, T, d)
        if self.router is not None:                                 # the dense MLP and the experts, side by side
            flat = x.reshape(-1, x.size(-1))                        # (N, d): the block's input, routed per token
            weights, chosen = self.router(flat, step.tap)
            step.tap("chosen_experts", chosen)
            routed = self.experts(self.pre_moe_norm(flat), weights, chosen).view(x.shape)
            h = self.post_dense_norm(h) + self.post_moe_norm(routed)
            step.tap("moe", h)
        h = self.post_mlp_norm(h)
        step.tap("post_feedforward_norm", h)
        x = x + h
        if per_layer is not None:                                   # this layer's per-layer embedding, gated in
            g = F.gelu(self.ple_gate(x), approximate="tanh") * per_layer  # (B, T, p)
            x = x + self.ple_norm(self.ple_out(g))
            step.tap("per_layer_input", x)
        return x * self.layer_scalar                                # (B, T, d)
