"""The Llama trace, the decoder most families are: GPT-2's trace with four substitutions.

No position embedding (RoPE rotates Q and K inside every attention layer), RMSNorm for LayerNorm,
a SwiGLU MLP (or routed experts) for GELU, and grouped-query attention (n_kv_heads ≤ n_heads K/V
heads, each shared by n_heads / n_kv_heads query heads). A family file (``gptconv/families/``) gives
its config's ``family`` and the options below it uses (biases, windows, q/k norms, experts, NoPE
layers, partial rotary, where the norms sit, µP multipliers, linear-attention layers); the forward does
not depend on the family. In a hybrid model (Qwen3.5, Qwen3-Next) some layers are linear attention
(``layers/linear_attention.py``): they mix positions through a recurrent state, not over keys; in LFM2
some are a gated short convolution (``layers/short_conv.py``): over their last few positions only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from .attention import Attention
from .config_checks import MAX_LAYERS, check_range, check_rope_heads, check_sizes, refuse_training
from .kv_cache import KVCache
from .linear import Linear, linear
from .linear_attention import DeltaNetShape, GatedDeltaNet
from .mla import MLAShape, MLAttention
from .mlp import Experts, MoE, SwiGLU
from .mtp import MTP
from .multipliers import Multipliers
from .norms import OffsetRMSNorm, RMSNorm
from .rope import RopeScaling, rope_frequencies
from .short_conv import ShortConv, ShortConvShape
from .step import Step
from .tap import Tap, no_tap

SLIDING, FULL, LINEAR, CONV = "sliding_attention", "full_attention", "linear_attention", "conv"  # HF's layer_types
NORM_PLACES = ("pre", "post", "sandwich")


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
    sliding_window: int | None = None  # layers attend to their last sliding_window positions: every layer,
    layer_types: tuple[str, ...] = ()  # or those SLIDING here (per layer, SLIDING, FULL, LINEAR or CONV); () → every layer
    linear_attention: DeltaNetShape | None = None  # the LINEAR layers' sizes (gated delta rule)
    short_conv: ShortConvShape | None = None  # the CONV layers' (gated short convolution)
    attention_gate: bool = False  # attention's output × sigmoid(gate(x)) before its projection (Qwen3-Next)
    offset_norms: bool = False  # RMSNorms scale by 1 + w (weights stored as offsets from 1), q/k norms too
    qk_norm: bool = False  # RMSNorm on q and k, before RoPE:
    qk_norm_over: str = "head"  # on each head (Qwen3), or "all": the whole projection (OLMo 2)
    rope_layers: tuple[bool, ...] = ()  # per layer, whether RoPE rotates q and k (False: a NoPE layer); () → all
    rope_dim: int = 0  # the first rope_dim dimensions of each head are rotated (partial rotary); 0 → head_dim
    rope_local_theta: float | None = None  # sliding layers rotate with this base, unscaled (OLMo 3: its full
    # layers' YaRN left out); None: every layer the same RoPE
    norms: str = "pre"  # "pre": RMSNorm before each sublayer; "post": on its output before the residual
    # add (OLMo 2, EXAONE 4); "sandwich": both
    multipliers: Multipliers = Multipliers()  # µP (Granite): the embedding, residual, attention, logits scaled
    experts: Experts | None = None  # routed experts and their router (``mlp.Experts``), on every layer or
    moe_layers: tuple[bool, ...] = ()  # per layer, experts (True) or the dense SwiGLU; () → experts on all
    attention_sinks: bool = False  # a learned logit per head joins the attention softmax (gpt-oss)
    mla: MLAShape | None = None  # multi-head latent attention on every layer (``layers/mla.py``): its sizes;
    # head_dim is then its q/k head (nope + rope) and rope_dim its rotated part
    mtp_layers: int = 0  # multi-token-prediction layers the checkpoint ships (``layers/mtp.py``): held, not run
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
                           "n_layers": MAX_LAYERS, "n_heads": 1024, "n_kv_heads": 1024, "d_ff": 1 << 20,
                           "head_dim": 4096})
        check_range(self, ("norm_eps",), 0.0, 1.0, low_open=True)
        check_range(self, ("rope_theta",), 0.0, 1e12, low_open=True)
        if self.rope_local_theta is not None:
            check_range(self, ("rope_local_theta",), 0.0, 1e12, low_open=True)
        check_range(self, ("attention_dropout",), 0.0, 1.0)
        check_rope_heads(self)
        if self.sliding_window is not None:
            check_sizes(self, {"sliding_window": 1 << 24})
        if self.mtp_layers:
            check_sizes(self, {"mtp_layers": 64})
        if self.rope_dim:
            check_sizes(self, {"rope_dim": self.head_dim})
            if self.rope_dim % 2:
                raise ValueError(f"rope_dim = {self.rope_dim} is odd: RoPE rotates pairs")
        if self.norms not in NORM_PLACES or self.qk_norm_over not in ("head", "all"):
            raise ValueError(f"norms '{self.norms}' / qk_norm_over '{self.qk_norm_over}' unknown")
        for name, allowed in (("layer_types", (SLIDING, FULL, LINEAR, CONV)), ("rope_layers", (True, False)),
                              ("moe_layers", (True, False))):
            value = tuple(getattr(self, name))
            if value and (len(value) != self.n_layers or any(v not in allowed or type(v) is not type(allowed[0])
                                                               for v in value)):
                raise ValueError(f"{name} must give one of {allowed} for each of the {self.n_layers} layers")
            object.__setattr__(self, name, value)
        if SLIDING in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types has sliding layers but sliding_window is None")
        if (LINEAR in self.layer_types) != (self.linear_attention is not None):
            raise ValueError("linear_attention gives the sizes of layer_types' linear_attention layers: both or neither")
        if (CONV in self.layer_types) != (self.short_conv is not None):
            raise ValueError("short_conv gives the options of layer_types' conv layers: both or neither")
        if self.mla is not None and (self.head_dim != self.mla.qk_head_dim
                                     or (self.rope_dim or self.head_dim) != self.mla.qk_rope_dim):
            raise ValueError(f"multi-head latent attention: head_dim {self.head_dim} and rope_dim {self.rope_dim} "
                             f"must be its q/k head ({self.mla.qk_head_dim}) and rotated part ({self.mla.qk_rope_dim})")
        # one spelling per model: a per-layer tuple that says the same of every layer is ()
        if self.layer_types and all(t == SLIDING for t in self.layer_types):
            object.__setattr__(self, "layer_types", ())
        if self.layer_types and all(t == FULL for t in self.layer_types):
            object.__setattr__(self, "layer_types", ())
            object.__setattr__(self, "sliding_window", None)
        for name in ("rope_layers", "moe_layers"):
            if all(getattr(self, name)):
                object.__setattr__(self, name, ())
        if self.moe_layers and self.experts is None:
            raise ValueError("moe_layers without experts")
        if self.rope_dim == self.head_dim:
            object.__setattr__(self, "rope_dim", 0)
        s, pairs = self.rope_scaling, (self.rope_dim or self.head_dim) // 2
        if s is not None and s.kind == "longrope" and len(s.factors) != pairs:
            raise ValueError(f"longrope has {len(s.factors)} RoPE factors for {pairs} frequencies")

    def features(self) -> set[str]:
        """What this config asks of the decoder beyond Llama's, by the names a family's writers say they
        have (a writer refuses a config with a feature its format has no place for)."""
        c, e = self, self.experts
        return {name for name, on in (
            ("layer_types", bool(c.layer_types)), ("NoPE layers", bool(c.rope_layers)),
            ("partial rotary", bool(c.rope_dim)),
            ("longrope", c.rope_scaling is not None and c.rope_scaling.kind == "longrope"),
            ("yarn", c.rope_scaling is not None and c.rope_scaling.kind == "yarn"),
            ("RoPE of its own on sliding layers", c.rope_local_theta is not None),
            (f"{c.norms} norms", c.norms != "pre"), ("q/k norm over the projection", c.qk_norm_over != "head"),
            ("µP multipliers", c.multipliers.applied),
            ("unnormalised expert weights", e is not None and not e.renormalise), ("expert size", bool(e and e.d_ff)),
            ("dense layers among experts", bool(c.moe_layers)),
            ("linear attention", LINEAR in c.layer_types), ("short convolution", CONV in c.layer_types),
            ("attention output gate", c.attention_gate),
            ("offset norms", c.offset_norms), ("shared expert", bool(e and e.shared_d_ff)),
            ("MTP layers", bool(c.mtp_layers)), ("router bias", bool(e and e.router_bias)),
            ("clamped SwiGLU experts", bool(e and e.clamp is not None)), ("attention sinks", c.attention_sinks),
            ("multi-head latent attention", c.mla is not None), ("sigmoid router", bool(e and e.scoring != "softmax")),
            ("expert groups", bool(e and e.groups != (1, 1))), ("routed scaling", bool(e and e.scaling != 1.0)),
            ("router correction bias", bool(e and e.correction_bias)),
            ("ungated shared expert", bool(e and e.shared_d_ff and not e.shared_gate))) if on}

    def window(self, layer: int) -> int | None:
        """The window layer ``layer`` attends within (None: every position)."""
        return self.sliding_window if not self.layer_types or self.layer_types[layer] == SLIDING else None

    def linear_at(self, layer: int) -> bool:
        """Whether layer ``layer`` is linear attention (a recurrent state, no keys)."""
        return bool(self.layer_types) and self.layer_types[layer] == LINEAR

    def conv_at(self, layer: int) -> bool:
        """Whether layer ``layer`` is a gated short convolution (its last few positions, no keys)."""
        return bool(self.layer_types) and self.layer_types[layer] == CONV

    def norm(self, d: int, eps: float = 0.0) -> nn.Module:
        """An RMSNorm of this model's convention over d features (``eps``: its own, where not the model's)."""
        return (OffsetRMSNorm if self.offset_norms else RMSNorm)(d, eps or self.norm_eps)

    def rope_at(self, layer: int) -> bool:
        return not self.rope_layers or self.rope_layers[layer]

    def experts_at(self, layer: int) -> bool:
        return self.experts is not None and (not self.moe_layers or self.moe_layers[layer])


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
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
        s = c.rope_scaling
        long = s is not None and s.kind == "longrope" and step.reach > s.original_context_length
        angles = step.angles(self.inv_freq(ids.device, long), x.dtype, 1.0 if s is None else s.attention_factor)
        local = step.angles(self.inv_freq(ids.device, local=True), x.dtype) if c.rope_local_theta is not None else None
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

    def train(self, mode: bool = True) -> Llama:
        refuse_training(self.config, mode)
        return super().train(mode)

    def cache_stale(self, cached: int, reach: int) -> bool:
        """Whether a KV cache of ``cached`` positions must be recomputed for a step reaching ``reach``: with
        longrope, the first step past the original context (its keys were rotated with the short factors,
        the whole sequence now rotates with the long ones), as transformers' phi3 generates."""
        s = self.config.rope_scaling
        return (s is not None and s.kind == "longrope" and 0 < cached <= s.original_context_length < reach)

    def inv_freq(self, device: torch.device, long: bool = False, local: bool = False) -> torch.Tensor:
        """The global layers' frequencies (longrope's ``long`` ones), or with ``local`` the sliding layers' own."""
        if (device, long, local) not in self._inv_freq:
            c = self.config
            dim = c.rope_dim or c.head_dim
            freqs = (rope_frequencies(dim, c.rope_local_theta) if local
                     else rope_frequencies(dim, c.rope_theta, c.rope_scaling, long))
            self._inv_freq[device, long, local] = freqs.to(device)
        return self._inv_freq[device, long, local]


def token_mixer(c: LlamaConfig, layer: int) -> nn.Module:
    """Layer ``layer``'s token mixer, the one step that mixes positions, (B, T, d) → (B, T, d) at a ``Step``:
    by its layer type, a linear-attention layer (the gated delta rule) or a gated short convolution; else
    attention, latent (MLA) where the model has its shape."""
    if c.linear_at(layer):
        return GatedDeltaNet(c.d_model, c.linear_attention, c.norm_eps)
    if c.conv_at(layer):
        return ShortConv(c.d_model, c.short_conv)
    if c.mla is not None:
        return MLAttention(c.d_model, c.n_heads, c.mla, lambda d: c.norm(d, c.mla.norm_eps), bias=c.qkv_bias)
    return Attention(c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, qkv_bias=c.qkv_bias, o_bias=c.o_bias,
                     qk_norm=c.norm if c.qk_norm else None, qk_norm_over=c.qk_norm_over, window=c.window(layer),
                     rope=c.rope_at(layer), scale=c.multipliers.attention, gate=c.attention_gate,
                     sinks=c.attention_sinks, dropout=c.attention_dropout)


def channel_mixer(c: LlamaConfig, layer: int) -> nn.Module:
    """Layer ``layer``'s MLP, (B, T, d) → (B, T, d): routed experts where the model has them on this layer
    (``mlp.Experts``), else the dense SwiGLU."""
    if c.experts_at(layer):
        return MoE(c.d_model, c.experts.d_ff or c.d_ff, c.experts)
    return SwiGLU(c.d_model, c.d_ff, c.mlp_bias)


class Block(nn.Module):
    """x + attn(norm1(x)), then x + mlp(norm2(x)): norms before the sublayers ("pre"); after them, on the
    sublayer's output before the residual add ("post": post_attn_norm, post_mlp_norm); or both ("sandwich")."""

    def __init__(self, config: LlamaConfig, layer: int = 0) -> None:
        super().__init__()
        c = config
        pre, post = c.norms in ("pre", "sandwich"), c.norms in ("post", "sandwich")
        norm = c.norm
        self.norm1 = norm(c.d_model) if pre else None
        self.attn = token_mixer(c, layer)
        self.post_attn_norm = norm(c.d_model) if post else None
        self.norm2 = norm(c.d_model) if pre else None
        self.mlp = channel_mixer(c, layer)
        self.post_mlp_norm = norm(c.d_model) if post else None
        self.residual_multiplier = c.multipliers.residual

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        h = self.attn(self.norm1(x) if self.norm1 is not None else x, step)  # (B, T, d)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
            step.tap("post_attention_norm", h)
        x = x + self.scaled(h)
        h = self.mlp(self.norm2(x) if self.norm2 is not None else x, step.tap)  # (B, T, d)
        if self.post_mlp_norm is not None:
            h = self.post_mlp_norm(h)
            step.tap("post_feedforward_norm", h)
        return x + self.scaled(h)

    def scaled(self, h: torch.Tensor) -> torch.Tensor:
        """A sublayer's output as it joins the residual stream (µP scales it)."""
        return h if self.residual_multiplier == 1.0 else h * self.residual_multiplier
