"""The decoder most families are (``Decoder``, ``DecoderConfig``): Llama's trace, GPT-2's with four substitutions.

No position embedding (RoPE rotates Q and K inside every attention layer), RMSNorm for LayerNorm,
a SwiGLU MLP (or routed experts) for GELU, and grouped-query attention (n_kv_heads ≤ n_heads K/V
heads, each shared by n_heads / n_kv_heads query heads). A block is assembled from parts, each with its
own small config, and a family file (``gptconv/families/``) passes the ones it differs by: the token
mixer (``token_mixer``: attention with its ``attention.AttentionOptions``, latent attention
``mla.MLAShape``, the gated delta rule ``linear_attention.DeltaNetShape``, the short convolution
``short_conv.ShortConvShape``), the channel mixer (``channel_mixer``: SwiGLU, or routed experts
``mlp.Experts``), the RoPE (``rope.Rotary``), the norms and where they sit (``norms.Norms``), µP's scales
(``multipliers.Multipliers``). The forward does not depend on the family; ``DecoderConfig.features``
says, as ``Feature`` members, what a config asks beyond Llama's, for the writers to accept or refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import torch
import torch.nn as nn

from .attention import Attention, AttentionOptions
from .config_checks import MAX_LAYERS, check_rope_heads, check_sizes, refuse_training
from .kv_cache import KVCache
from .linear import Linear, linear
from .linear_attention import DeltaNetShape, GatedDeltaNet
from .mla import MLAShape, MLAttention
from .mlp import Experts, MLPOptions, MoE
from .mtp import MTP
from .multipliers import Multipliers
from .norms import Norms
from .rope import Rotary, rope_frequencies
from .short_conv import ShortConv, ShortConvShape
from .step import Step
from .tap import Tap, no_tap

SLIDING, FULL, LINEAR, CONV = "sliding_attention", "full_attention", "linear_attention", "conv"  # HF's layer_types


class Feature(StrEnum):
    """What a config asks of the decoder beyond Llama's (``DecoderConfig.features``), each named as a refusal
    says it: a family's writers list those their format has a place for, and refuse a config with another."""

    LAYER_TYPES = "layer_types"
    NOPE_LAYERS = "NoPE layers"
    PARTIAL_ROTARY = "partial rotary"
    LONGROPE = "longrope"
    YARN = "yarn"
    LOCAL_ROPE = "RoPE of its own on sliding layers"
    POST_NORMS = "post norms"
    SANDWICH_NORMS = "sandwich norms"
    QK_NORM_OVER_ALL = "q/k norm over the projection"
    MUP = "µP multipliers"
    UNNORMALISED_EXPERTS = "unnormalised expert weights"
    EXPERT_SIZE = "expert size"
    DENSE_AMONG_EXPERTS = "dense layers among experts"
    LINEAR_ATTENTION = "linear attention"
    SHORT_CONV = "short convolution"
    ATTENTION_GATE = "attention output gate"
    OFFSET_NORMS = "offset norms"
    SHARED_EXPERT = "shared expert"
    MTP = "MTP layers"
    ROUTER_BIAS = "router bias"
    CLAMPED_EXPERTS = "clamped SwiGLU experts"
    SINKS = "attention sinks"
    MLA = "multi-head latent attention"
    SIGMOID_ROUTER = "sigmoid router"
    EXPERT_GROUPS = "expert groups"
    ROUTED_SCALING = "routed scaling"
    CORRECTION_BIAS = "router correction bias"
    UNGATED_SHARED_EXPERT = "ungated shared expert"
    PARALLEL_RESIDUAL = "parallel residual"
    LAYER_NORM = "LayerNorm"
    UNGATED_MLP = "ungated MLP"
    MLP_ACTIVATION = "an MLP activation other than SiLU"


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    context_length: int  # HF: max_position_embeddings
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    head_dim: int = 0  # 0: d_model // n_heads
    norms: Norms = Norms()  # their eps, convention (offset) and place (pre, post, sandwich)
    rope: Rotary = Rotary()  # theta, scaling, partial rotary, the sliding layers' own, NoPE layers
    tie_embeddings: bool = False
    attention: AttentionOptions = AttentionOptions()  # biases, q/k norms, gate, sinks, dropout, window
    mlp: MLPOptions = MLPOptions()  # the dense MLP: gated (SwiGLU) or not (GELU), its biases
    layer_types: tuple[str, ...] = ()  # per layer, SLIDING, FULL, LINEAR or CONV; () → every layer attends
    # (within attention.window where it has one)
    linear_attention: DeltaNetShape | None = None  # the LINEAR layers' sizes (gated delta rule)
    short_conv: ShortConvShape | None = None  # the CONV layers' (gated short convolution)
    multipliers: Multipliers = Multipliers()  # µP (Granite): the embedding, residual, attention, logits scaled
    experts: Experts | None = None  # routed experts and their router (``mlp.Experts``), on every layer or
    moe_layers: tuple[bool, ...] = ()  # per layer, experts (True) or the dense SwiGLU; () → experts on all
    mla: MLAShape | None = None  # multi-head latent attention on every layer (``layers/mla.py``): its sizes;
    # head_dim is then its q/k head (nope + rope) and rope.dim its rotated part
    mtp_layers: int = 0  # multi-token-prediction layers the checkpoint ships (``layers/mtp.py``): held, not run
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
                           "n_layers": MAX_LAYERS, "n_heads": 1024, "n_kv_heads": 1024, "d_ff": 1 << 20,
                           "head_dim": 4096})
        check_rope_heads(self)
        if self.mtp_layers:
            check_sizes(self, {"mtp_layers": 64})
        r = self.rope
        if r.dim > self.head_dim:
            raise ValueError(f"RoPE: dim = {r.dim} is larger than head_dim = {self.head_dim}")
        for name, value, allowed in (("layer_types", self.layer_types, (SLIDING, FULL, LINEAR, CONV)),
                                     ("rope.layers", r.layers, (True, False)),
                                     ("moe_layers", self.moe_layers, (True, False))):
            value = tuple(value)
            if value and (len(value) != self.n_layers or any(v not in allowed or type(v) is not type(allowed[0])
                                                               for v in value)):
                raise ValueError(f"{name} must give one of {allowed} for each of the {self.n_layers} layers")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "moe_layers", tuple(self.moe_layers))
        if SLIDING in self.layer_types and self.attention.window is None:
            raise ValueError("layer_types has sliding layers but attention.window is None")
        if (LINEAR in self.layer_types) != (self.linear_attention is not None):
            raise ValueError("linear_attention gives the sizes of layer_types' linear_attention layers: both or neither")
        if (CONV in self.layer_types) != (self.short_conv is not None):
            raise ValueError("short_conv gives the options of layer_types' conv layers: both or neither")
        if self.mla is not None and (self.head_dim != self.mla.qk_head_dim
                                     or (r.dim or self.head_dim) != self.mla.qk_rope_dim):
            raise ValueError(f"multi-head latent attention: head_dim {self.head_dim} and rope.dim {r.dim} "
                             f"must be its q/k head ({self.mla.qk_head_dim}) and rotated part ({self.mla.qk_rope_dim})")
        # one spelling per model: a per-layer tuple that says the same of every layer is ()
        if self.layer_types and all(t == SLIDING for t in self.layer_types):
            object.__setattr__(self, "layer_types", ())
        if self.layer_types and all(t == FULL for t in self.layer_types):
            object.__setattr__(self, "layer_types", ())
            object.__setattr__(self, "attention", replace(self.attention, window=None))
        if all(self.moe_layers):
            object.__setattr__(self, "moe_layers", ())
        if self.moe_layers and self.experts is None:
            raise ValueError("moe_layers without experts")
        if r.dim == self.head_dim:
            object.__setattr__(self, "rope", replace(r, dim=0))
        s, pairs = r.scaling, r.pairs(self.head_dim)
        if s is not None and s.kind == "longrope" and len(s.factors) != pairs:
            raise ValueError(f"longrope has {len(s.factors)} RoPE factors for {pairs} frequencies")

    @classmethod
    def build(cls, *, attention: dict[str, Any] | None = None, rope: dict[str, Any] | None = None,
              norms: dict[str, Any] | None = None, mlp: dict[str, Any] | None = None, **fields: Any) -> DecoderConfig:
        """The config with its attention, RoPE, norms and MLP given as their parts' fields (a converter
        gathers them from several places), each part checked as it is made."""
        return cls(attention=AttentionOptions(**(attention or {})), rope=Rotary(**(rope or {})),
                   norms=Norms(**(norms or {})), mlp=MLPOptions(**(mlp or {})), **fields)

    def features(self) -> set[Feature]:
        """What this config asks of the decoder beyond Llama's (a writer refuses a config with a feature its
        format has no place for)."""
        c, e, r, a = self, self.experts, self.rope, self.attention
        kind = r.scaling.kind if r.scaling is not None else None
        return {f for f, on in (
            (Feature.LAYER_TYPES, bool(c.layer_types)), (Feature.NOPE_LAYERS, bool(r.layers)),
            (Feature.PARTIAL_ROTARY, bool(r.dim)), (Feature.LONGROPE, kind == "longrope"),
            (Feature.YARN, kind == "yarn"), (Feature.LOCAL_ROPE, r.local_theta is not None),
            (Feature.POST_NORMS, c.norms.place == "post"), (Feature.SANDWICH_NORMS, c.norms.place == "sandwich"),
            (Feature.PARALLEL_RESIDUAL, c.norms.parallel), (Feature.LAYER_NORM, c.norms.kind == "layer"),
            (Feature.UNGATED_MLP, not c.mlp.gated), (Feature.MLP_ACTIVATION, c.mlp.act != "silu"),
            (Feature.QK_NORM_OVER_ALL, a.qk_norm_over != "head"),
            (Feature.MUP, c.multipliers.applied),
            (Feature.UNNORMALISED_EXPERTS, e is not None and not e.renormalise),
            (Feature.EXPERT_SIZE, bool(e and e.d_ff)), (Feature.DENSE_AMONG_EXPERTS, bool(c.moe_layers)),
            (Feature.LINEAR_ATTENTION, LINEAR in c.layer_types), (Feature.SHORT_CONV, CONV in c.layer_types),
            (Feature.ATTENTION_GATE, a.gate), (Feature.OFFSET_NORMS, c.norms.offset),
            (Feature.SHARED_EXPERT, bool(e and e.shared_d_ff)), (Feature.MTP, bool(c.mtp_layers)),
            (Feature.ROUTER_BIAS, bool(e and e.router_bias)), (Feature.CLAMPED_EXPERTS, bool(e and e.clamp is not None)),
            (Feature.SINKS, a.sinks), (Feature.MLA, c.mla is not None),
            (Feature.SIGMOID_ROUTER, bool(e and e.scoring != "softmax")),
            (Feature.EXPERT_GROUPS, bool(e and e.groups != (1, 1))), (Feature.ROUTED_SCALING, bool(e and e.scaling != 1.0)),
            (Feature.CORRECTION_BIAS, bool(e and e.correction_bias)),
            (Feature.UNGATED_SHARED_EXPERT, bool(e and e.shared_d_ff and not e.shared_gate))) if on}

    def window(self, layer: int) -> int | None:
        """The window layer ``layer`` attends within (None: every position)."""
        return self.attention.window if not self.layer_types or self.layer_types[layer] == SLIDING else None

    def linear_at(self, layer: int) -> bool:
        """Whether layer ``layer`` is linear attention (a recurrent state, no keys)."""
        return bool(self.layer_types) and self.layer_types[layer] == LINEAR

    def conv_at(self, layer: int) -> bool:
        """Whether layer ``layer`` is a gated short convolution (its last few positions, no keys)."""
        return bool(self.layer_types) and self.layer_types[layer] == CONV

    def norm(self, d: int, eps: float = 0.0) -> nn.Module:
        """An RMSNorm of this model's convention over d features (``eps``: its own, where not the model's)."""
        return self.norms.make(d, eps)

    def rope_at(self, layer: int) -> bool:
        return self.rope.at(layer)

    def experts_at(self, layer: int) -> bool:
        return self.experts is not None and (not self.moe_layers or self.moe_layers[layer])


class Decoder(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm_f = config.norm(config.d_model)
        self.lm_head = None if config.tie_embeddings else Linear(config.d_model, config.vocab_size, bias=False)
        # the draft head some checkpoints ship for speculative decoding: held for export, not run by forward
        self.mtp = MTP(config, Block) if config.mtp_layers else None
        self._inv_freq: dict[tuple[torch.device, bool, bool], torch.Tensor] = {}

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None, last_only: bool = False, tap: Tap = no_tap,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) → logits (B, T, V), or (B, 1, V) with ``last_only``. ``attention_mask``
        (B, T), 0 at pad tokens (left or right): each sequence gets the logits it gets alone."""
        c = self.config
        step = Step.begin(ids, cache, attention_mask, tap, c.context_length)
        x = self.tok_emb(ids)                                       # (B, T, d): no position embedding
        tap("token_embedding", x)                                   # the lookup, as HF's embed_tokens gives it
        if c.multipliers.embedding != 1.0:
            x = x * c.multipliers.embedding                         # µP: the embedding scaled
        # (T, rope_dim) each: used inside attention; longrope's long factors once a step reaches past the
        # original context (transformers' rule, decided per forward call)
        s = c.rope.scaling
        long = s is not None and s.kind == "longrope" and step.reach > s.original_context_length
        angles = step.angles(self.inv_freq(ids.device, long), x.dtype, 1.0 if s is None else s.attention_factor)
        local = step.angles(self.inv_freq(ids.device, local=True), x.dtype) if c.rope.local_theta is not None else None
        for i, block in enumerate(self.blocks):
            here = local if local is not None and c.window(i) is not None else angles
            x = block(x, step.at(i, here))                          # (B, T, d)
            tap(f"block.{i}", x)
        if last_only:
            x = x[:, -1:]                                           # (B, 1, d): only the next token matters
        x = self.norm_f(x)                                          # (B, T, d)
        tap("final_norm", x)
        head = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        logits = linear(x, head)                                    # (B, T, V)
        if c.multipliers.logits != 1.0:
            logits = logits / c.multipliers.logits                  # µP: the logits scaled down
        tap("logits", logits)
        return logits

    def train(self, mode: bool = True) -> Decoder:
        refuse_training(self.config, mode)
        return super().train(mode)

    def cache_stale(self, cached: int, reach: int) -> bool:
        """Whether a KV cache of ``cached`` positions must be recomputed for a step reaching ``reach``: with
        longrope, the first step past the original context (its keys were rotated with the short factors,
        the whole sequence now rotates with the long ones), as transformers' phi3 generates."""
        s = self.config.rope.scaling
        return (s is not None and s.kind == "longrope" and 0 < cached <= s.original_context_length < reach)

    def inv_freq(self, device: torch.device, long: bool = False, local: bool = False) -> torch.Tensor:
        """The global layers' frequencies (longrope's ``long`` ones), or with ``local`` the sliding layers' own."""
        if (device, long, local) not in self._inv_freq:
            r, dim = self.config.rope, self.config.rope.dim or self.config.head_dim
            freqs = (rope_frequencies(dim, r.local_theta) if local else rope_frequencies(dim, r.theta, r.scaling, long))
            self._inv_freq[device, long, local] = freqs.to(device)
        return self._inv_freq[device, long, local]


def token_mixer(c: DecoderConfig, layer: int) -> nn.Module:
    """Layer ``layer``'s token mixer, the one step that mixes positions, (B, T, d) → (B, T, d) at a ``Step``:
    by its layer type, a linear-attention layer (the gated delta rule) or a gated short convolution; else
    attention, latent (MLA) where the model has its shape."""
    if c.linear_at(layer):
        return GatedDeltaNet(c.d_model, c.linear_attention, c.norms.eps)
    if c.conv_at(layer):
        return ShortConv(c.d_model, c.short_conv)
    if c.mla is not None:
        return MLAttention(c.d_model, c.n_heads, c.mla, lambda d: c.norm(d, c.mla.norm_eps), bias=c.attention.qkv_bias)
    a = c.attention
    return Attention(c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, qkv_bias=a.qkv_bias, o_bias=a.o_bias,
                     qk_norm=c.norm if a.qk_norm else None, qk_norm_over=a.qk_norm_over, window=c.window(layer),
                     rope=c.rope.at(layer), scale=c.multipliers.attention, gate=a.gate, sinks=a.sinks,
                     dropout=a.dropout)


def channel_mixer(c: DecoderConfig, layer: int) -> nn.Module:
    """Layer ``layer``'s MLP, (B, T, d) → (B, T, d): routed experts where the model has them on this layer
    (``mlp.Experts``), else the dense MLP its ``MLPOptions`` say (SwiGLU, or GPT-NeoX's ungated GELU)."""
    if c.experts_at(layer):
        return MoE(c.d_model, c.experts.d_ff or c.d_ff, c.experts)
    return c.mlp.make(c.d_model, c.d_ff)


class Block(nn.Module):
    """x + attn(norm1(x)), then x + mlp(norm2(x)): norms before the sublayers ("pre"); after them, on the
    sublayer's output before the residual add ("post": post_attn_norm, post_mlp_norm); or both ("sandwich").
    Parallel (GPT-NeoX): both sublayers read the block's input, x + attn(norm1(x)) + mlp(norm2(x))."""

    def __init__(self, config: DecoderConfig, layer: int = 0) -> None:
        super().__init__()
        c = config
        pre, post = c.norms.pre, c.norms.post
        norm = c.norm
        self.norm1 = norm(c.d_model) if pre else None
        self.attn = token_mixer(c, layer)
        self.post_attn_norm = norm(c.d_model) if post else None
        self.norm2 = norm(c.d_model) if pre else None
        self.mlp = channel_mixer(c, layer)
        self.post_mlp_norm = norm(c.d_model) if post else None
        self.residual_multiplier = c.multipliers.residual
        self.parallel = c.norms.parallel

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        h = self.attn(self.norm1(x) if self.norm1 is not None else x, step)  # (B, T, d)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
            step.tap("post_attention_norm", h)
        if self.parallel:  # the MLP reads the block's input too; (mlp + attn) + x, as transformers adds them
            return self.scaled(self.mlp(self.norm2(x), step.tap)) + self.scaled(h) + x
        x = x + self.scaled(h)
        h = self.mlp(self.norm2(x) if self.norm2 is not None else x, step.tap)  # (B, T, d)
        if self.post_mlp_norm is not None:
            h = self.post_mlp_norm(h)
            step.tap("post_feedforward_norm", h)
        return x + self.scaled(h)

    def scaled(self, h: torch.Tensor) -> torch.Tensor:
        """A sublayer's output as it joins the residual stream (µP scales it)."""
        return h if self.residual_multiplier == 1.0 else h * self.residual_multiplier


def typed_features(has: frozenset[Feature] | set[Feature]) -> frozenset[Feature]:
    """A writer's ``has``, checked to be ``Feature`` members (a phrase would compare equal and hide a typo)."""
    bad = sorted(repr(h) for h in has if not isinstance(h, Feature))
    if bad:
        raise TypeError(f"features must be decoder.Feature members, not {', '.join(bad)}")
    return frozenset(has)
