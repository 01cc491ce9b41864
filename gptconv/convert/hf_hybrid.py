"""Hugging Face names and config fields of the hybrid decoders (Qwen3.5/3.6, Qwen3-Next): linear-attention
layers (a gated delta rule, ``layers/linear_attention.py``) among gated full-attention layers, and the
shared expert of their MoE. The families (``families/qwen3_5.py``, ``qwen3_5_moe.py``, ``qwen3_next.py``)
pick the rows their files have.
"""

from __future__ import annotations

from typing import Any

import torch

from ..layers.decoder import FULL, LINEAR, DecoderConfig
from ..layers.linear_attention import DeltaNetShape
from .hf_config import ConfigFields
from .hf_decoder import decoder_config_from_hf
from .keymap import Fuse, Fused, Map, Transform

# the depthwise convolution's weight: HF's nn.Conv1d holds (C, 1, kernel), ours (C, kernel)
CONV = Transform("conv1d", lambda t, c: t.squeeze(1), lambda t, c: t.unsqueeze(1).contiguous(),
                 lambda s, c: (s[0], s[2]) if len(s) == 3 and s[1] == 1 else (-1,))

# a linear-attention layer as Qwen3.5 stores it: q, k, v in one projection (all q heads, then k, then v)
LINEAR_ATTENTION = [(f"linear_attn.{hf}", f"attn.{ours}") for hf, ours in (
    ("in_proj_qkv.weight", "in_qkv.weight"), ("in_proj_z.weight", "in_z.weight"), ("in_proj_b.weight", "in_b.weight"),
    ("in_proj_a.weight", "in_a.weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias"), ("norm.weight", "norm.weight"),
    ("out_proj.weight", "out.weight"))]
LINEAR_CONV = Map("model.layers.{i}.linear_attn.conv1d.weight", "blocks.{i}.attn.conv.weight", CONV)
# the shared expert beside the routed ones, and its gate
SHARED_EXPERT = [*((f"mlp.shared_expert.{n}_proj.weight", f"mlp.shared.{n}.weight") for n in ("gate", "up", "down")),
                 ("mlp.shared_expert_gate.weight", "mlp.shared_gate.weight")]


def per_head(name: str, sizes: Any) -> Fuse:
    """A source tensor holding, per group of rows, parts of the sizes ``sizes(config)`` (one per target) side
    by side: ``groups`` repeats of [part 0, part 1, …]; our targets hold each part's rows of every group."""
    def split(t: torch.Tensor, c: DecoderConfig) -> list[torch.Tensor]:
        groups, widths = sizes(c)
        rows = t.view(groups, sum(widths), *t.shape[1:]).split(widths, dim=1)
        return [r.reshape(groups * w, *t.shape[1:]) for r, w in zip(rows, widths)]

    def join(parts: list[torch.Tensor], c: DecoderConfig) -> torch.Tensor:
        groups, widths = sizes(c)
        return torch.cat([p.view(groups, w, *p.shape[1:]) for p, w in zip(parts, widths)], dim=1).reshape(
            groups * sum(widths), *parts[0].shape[1:])

    def shapes(s: tuple[int, ...], c: DecoderConfig) -> list[tuple[int, ...]]:
        groups, widths = sizes(c)
        if not s or s[0] != groups * sum(widths):
            return [s]  # cannot be split so: the ledger reports the shape
        return [(groups * w, *s[1:]) for w in widths]
    return Fuse(name, split, join, shapes)


# the gated attention's q projection: per head, its q rows then its gate rows (transformers' Qwen3-Next and
# Qwen3.5 split each head's 2 · head_dim outputs in half)
GATED_Q = Fused("model.layers.{i}.self_attn.q_proj.weight", ["blocks.{i}.attn.q.weight", "blocks.{i}.attn.gate.weight"],
                per_head("q and gate per head", lambda c: (c.n_heads, [c.head_dim, c.head_dim])))


def _qkvz(c: DecoderConfig) -> tuple[int, list[int]]:
    s = c.linear_attention
    group = s.v_heads // s.k_heads
    return s.k_heads, [s.k_dim, s.k_dim, group * s.v_dim, group * s.v_dim]


def _split_qkvz(t: torch.Tensor, c: DecoderConfig) -> list[torch.Tensor]:
    q, k, v, z = per_head("", _qkvz).split(t, c)
    return [torch.cat([q, k, v]), z]


def _join_qkvz(parts: list[torch.Tensor], c: DecoderConfig) -> torch.Tensor:
    s = c.linear_attention
    qkv, z = parts
    q, k, v = qkv.split([s.k_heads * s.k_dim, s.k_heads * s.k_dim, s.v_heads * s.v_dim])
    return per_head("", _qkvz).join([q, k, v, z], c)


def _shapes_qkvz(s: tuple[int, ...], c: DecoderConfig) -> list[tuple[int, ...]]:
    groups, widths = _qkvz(c)
    if not s or s[0] != groups * sum(widths):
        return [s]
    return [(groups * sum(widths[:3]), *s[1:]), (groups * widths[3], *s[1:])]


# Qwen3-Next stores q, k, v and z of each key head's group side by side in one projection, and b and a so too
QWEN3_NEXT_LINEAR = [
    Fused("model.layers.{i}.linear_attn.in_proj_qkvz.weight", ["blocks.{i}.attn.in_qkv.weight",
                                                               "blocks.{i}.attn.in_z.weight"],
          Fuse("q, k, v, z per key head", _split_qkvz, _join_qkvz, _shapes_qkvz)),
    Fused("model.layers.{i}.linear_attn.in_proj_ba.weight", ["blocks.{i}.attn.in_b.weight", "blocks.{i}.attn.in_a.weight"],
          per_head("b, a per key head", lambda c: (c.linear_attention.k_heads,
                                                    [c.linear_attention.v_heads // c.linear_attention.k_heads] * 2))),
]


def hybrid_from_hf(f: ConfigFields) -> dict[str, Any]:
    """layer_types (each layer linear or full attention; absent: every ``full_attention_interval``-th layer
    is full, as transformers builds them) and the linear layers' sizes, with transformers' defaults."""
    n = f.int("num_hidden_layers")
    types = f.data.get("layer_types")
    if types is None:
        interval = f.positive("full_attention_interval", 4)
        types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n)]
    if not isinstance(types, list) or len(types) != n or not all(t in (FULL, LINEAR) for t in types):
        raise f.error(f"layer_types must give linear_attention or full_attention for each of the {n} layers")
    try:
        shape = DeltaNetShape(k_heads=f.positive("linear_num_key_heads", 16),
                              v_heads=f.positive("linear_num_value_heads", 32),
                              k_dim=f.positive("linear_key_head_dim", 128), v_dim=f.positive("linear_value_head_dim", 128),
                              conv_kernel=f.positive("linear_conv_kernel_dim", 4))
    except ValueError as e:
        raise f.error(str(e)) from None
    return dict(layer_types=tuple(types), linear_attention=shape if LINEAR in types else None)


def hybrid_config_from_hf(f: ConfigFields, family: str, **specific: Any) -> DecoderConfig:
    """The fields every Qwen hybrid shares: q/k norms, gated attention, partial rotary, 1 + w norms."""
    bias = f.bool("attention_bias", False)
    return decoder_config_from_hf(f, family, {}, attention=dict(qkv_bias=bias, o_bias=bias, qk_norm=True, gate=True),
                                  partial_rotary=True, norms=dict(offset=True), **hybrid_from_hf(f), **specific)


def hybrid_to_hf(c: DecoderConfig) -> dict[str, Any]:
    s = c.linear_attention
    out = {"layer_types": [LINEAR if c.linear_at(i) else FULL for i in range(c.n_layers)]}
    if s is not None:
        out.update(linear_num_key_heads=s.k_heads, linear_num_value_heads=s.v_heads, linear_key_head_dim=s.k_dim,
                   linear_value_head_dim=s.v_dim, linear_conv_kernel_dim=s.conv_kernel)
    if c.mtp_layers:  # as the released configs say it (transformers keeps it, unread)
        out["mtp_num_hidden_layers"] = c.mtp_layers
    return out


# the gated full-attention layers' k, v, o and q/k norms (their q is ``GATED_Q``)
GATED_ATTENTION = [(f"self_attn.{n}_proj.weight", f"attn.{n}.weight") for n in "kvo"] + [
    ("self_attn.q_norm.weight", "attn.q_norm.weight"), ("self_attn.k_norm.weight", "attn.k_norm.weight")]
