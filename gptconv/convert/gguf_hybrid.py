"""llama.cpp's layout of the Qwen hybrid decoders (``qwen35``, ``qwen35moe``, ``qwen3next``): the gated delta
rule's tensors under llama.cpp's ``ssm_*`` names, and the metadata its converter writes.

llama.cpp's converter changes the linear layers' tensors on the way, and these rows do the same:
- ``ssm_a`` holds −exp(A_log), the decay rate itself (read back through log: within a float32 rounding
  of what exp(A_log) gives);
- Qwen3.5's files (qwen35, qwen35moe) hold the value heads "tiled" rather than grouped by key head: value
  head j of key head i moves from place i·r + j to j·k_heads + i (r value heads per key head), so that
  ggml can broadcast the key heads over the value heads. That reorders the v rows of ``attn_qkv``, the
  rows of ``attn_gate``, ``ssm_beta``, ``ssm_alpha``, ``ssm_a``, ``ssm_dt``, the v channels of
  ``ssm_conv1d`` and the columns of ``ssm_out``. Qwen3-Next's files (qwen3next) keep the grouped order.
- Every norm that scales by 1 + w is stored as 1 + w (``NORM_PLUS_ONE``); the gated norm (``ssm_norm``)
  scales by w and is stored as it is.
The full-attention layers' ``attn_q`` holds q and the output gate interleaved per head, as HF's q_proj.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from gguf import Keys

from ..errors import GptconvError, where
from ..layers.decoder import FULL, LINEAR, Feature, DecoderConfig
from ..layers.linear_attention import DeltaNetShape
from .gguf_decoder import (EXPERTS, NORM_PLUS_ONE, add_decoder_hparams, add_key_length, decoder_config_from_gguf,
                           experts_of)
from .gguf_meta import T, block_count, gguf_name
from .hf_hybrid import per_head
from .keymap import Fused, KeyMap, Map, Rule, Tied, Transform
from .mtp import mtp_gguf_rows

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

MROPE_SECTIONS = [11, 11, 10, 0]  # llama.cpp's qwen35 requires them; for text any sections are plain RoPE


def add_mrope_sections(w: GGUFWriter, c: DecoderConfig, arch: str) -> None:
    """The M-RoPE sections llama.cpp's qwen35 requires (the converter's default): llama.cpp asserts (and
    aborts the process) when they add up to more than head_dim, so such a model is refused."""
    if sum(MROPE_SECTIONS) > c.head_dim:
        raise GptconvError(f"llama.cpp's {arch} rotates M-RoPE sections of {sum(MROPE_SECTIONS)} dimensions, more than "
                           f"this model's head_dim {c.head_dim} (it would abort); not exported")
    w.add_rope_dimension_sections(MROPE_SECTIONS)


def _tile(t: torch.Tensor, c: DecoderConfig, width: int, dim: int, inverse: bool = False) -> torch.Tensor:
    """Value heads (blocks of ``width`` along ``dim``) from grouped by key head to tiled (``inverse``: back)."""
    s = c.linear_attention
    r = s.v_heads // s.k_heads
    if r == 1:
        return t
    groups = (r, s.k_heads) if inverse else (s.k_heads, r)
    shape = list(t.shape)
    t = t.reshape(*shape[:dim], *groups, width, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape).contiguous()


def _tiled(name: str, width: Any, dim: int = 0, after: Any = None) -> Transform:
    """GGUF (tiled) → ours (grouped) for a tensor of value heads of ``width(c)`` along ``dim``; ``after``:
    how many leading entries along ``dim`` are not value heads (the q and k rows of ``attn_qkv``)."""
    def move(t: torch.Tensor, c: DecoderConfig, inverse: bool) -> torch.Tensor:
        lead = after(c) if after else 0
        head, tail = t.narrow(dim, 0, lead), t.narrow(dim, lead, t.shape[dim] - lead)
        return torch.cat([head, _tile(tail, c, width(c), dim, inverse)], dim) if lead else _tile(tail, c, width(c), dim,
                                                                                              inverse)
    return Transform(name, lambda t, c: move(t, c, True), lambda t, c: move(t, c, False))


_V = lambda c: c.linear_attention.v_dim  # noqa: E731
_ONE = lambda c: 1  # noqa: E731
_QK = lambda c: 2 * c.linear_attention.k_heads * c.linear_attention.k_dim  # noqa: E731
# the decay rate: GGUF −exp(A_log), ours A_log (the log taken in float64, rounded once)
_PER_HEAD = _tiled("tiled", _ONE)  # one value per value head (β's and the decay's inputs, dt_bias, A_log)
_RATE = Transform("-exp", lambda t, c: torch.log(-t.double()).to(t.dtype), lambda t, c: -torch.exp(t))
_TILED_RATE = Transform("-exp, tiled", lambda t, c: _RATE.forward(_PER_HEAD.forward(t, c), c),
                        lambda t, c: _PER_HEAD.inverse(_RATE.inverse(t, c), c))


def _linear_rows(tiled: bool) -> list[Rule]:
    """A linear-attention layer's rows; ``tiled``: Qwen3.5's value-head order (else Qwen3-Next's grouped one)."""
    def row(tensor, part: str, ours: str, transform: Transform | None) -> Rule:
        name = gguf_name(tensor, part) if part else gguf_name(tensor).removesuffix(".weight")
        return Map(name, f"blocks.{{i}}.attn.{ours}", *([transform] if transform is not None else []))
    t = tiled
    rows = [row(T.ATTN_QKV, "weight", "in_qkv.weight", _tiled("v rows tiled", _V, after=_QK) if t else None),
            row(T.ATTN_GATE, "weight", "in_z.weight", _tiled("tiled", _V) if t else None),
            row(T.SSM_A, "", "A_log", _TILED_RATE if t else _RATE),
            row(T.SSM_DT, "bias", "dt_bias", _PER_HEAD if t else None),
            row(T.SSM_CONV1D, "weight", "conv.weight", _tiled("v channels tiled", _V, after=_QK) if t else None),
            row(T.SSM_NORM, "weight", "norm.weight", None),
            row(T.SSM_OUT, "weight", "out.weight", _tiled("columns tiled", _V, dim=1) if t else None)]
    if tiled:
        return rows + [row(T.SSM_BETA, "weight", "in_b.weight", _PER_HEAD),
                       row(T.SSM_ALPHA, "weight", "in_a.weight", _PER_HEAD)]
    per_key_head = lambda c: (c.linear_attention.k_heads, [c.linear_attention.v_heads // c.linear_attention.k_heads] * 2)  # noqa: E731
    return rows + [Fused(gguf_name(T.SSM_BETA_ALPHA), ["blocks.{i}.attn.in_b.weight", "blocks.{i}.attn.in_a.weight"],
                         per_head("b, a per key head", per_key_head))]


SHARED_EXPERT = [Map(gguf_name(src), f"blocks.{{i}}.mlp.{dst}.weight") for src, dst in (
    (T.FFN_GATE_SHEXP, "shared.gate"), (T.FFN_UP_SHEXP, "shared.up"), (T.FFN_DOWN_SHEXP, "shared.down"),
    (T.FFN_GATE_INP_SHEXP, "shared_gate"))]


def hybrid_gguf_keymap(c: DecoderConfig, arch: str, tiled: bool) -> KeyMap:
    """Every row of a Qwen hybrid file: norms (1 + w), the gated attention (q and gate interleaved in
    ``attn_q``), the linear layers, and a dense MLP or routed experts with the shared one."""
    plus_one = lambda tensor, ours: Map(gguf_name(tensor), ours, NORM_PLUS_ONE)  # noqa: E731
    mlp = ([*EXPERTS, *SHARED_EXPERT] if c.experts else
           [Map(gguf_name(src), f"blocks.{{i}}.mlp.{dst}.weight")
            for src, dst in ((T.FFN_GATE, "gate"), (T.FFN_UP, "up"), (T.FFN_DOWN, "down"))])
    q_and_gate = per_head("q and gate per head", lambda c: (c.n_heads, [c.head_dim, c.head_dim]))
    layers = [
        plus_one(T.ATTN_NORM, "blocks.{i}.norm1.weight"), plus_one(T.ATTN_POST_NORM, "blocks.{i}.norm2.weight"),
        Fused(gguf_name(T.ATTN_Q), ["blocks.{i}.attn.q.weight", "blocks.{i}.attn.gate.weight"], q_and_gate),
        *(Map(gguf_name(src), f"blocks.{{i}}.attn.{dst}.weight") for src, dst in ((T.ATTN_K, "k"), (T.ATTN_V, "v"),
                                                                                (T.ATTN_OUT, "o"))),
        plus_one(T.ATTN_Q_NORM, "blocks.{i}.attn.q_norm.weight"), plus_one(T.ATTN_K_NORM, "blocks.{i}.attn.k_norm.weight"),
        *_linear_rows(tiled),
        *mlp,
    ]
    return KeyMap(f"{arch} (GGUF)", [
        Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
        *layers,
        plus_one(T.OUTPUT_NORM, "norm_f.weight"),
        Tied(gguf_name(T.OUTPUT), "tok_emb.weight") if c.tie_embeddings else Map(gguf_name(T.OUTPUT), "lm_head.weight"),
        *mtp_gguf_rows(c.n_layers, c.mtp_layers, layers, NORM_PLUS_ONE),
    ])


def hybrid_config_from_gguf(f: GGUFFields, tensors: dict, family: str, experts: dict[str, Any] | None = None,
                            **specific: Any) -> DecoderConfig:
    """A Qwen hybrid's config: which layers are linear (``attention.recurrent_layers``, else every
    ``full_attention_interval``-th is full) and the linear layers' sizes from the ``ssm`` keys; routed
    experts where the file declares them, with the family's ``experts`` fields (of ``mlp.Experts``)."""
    blocks = block_count(f, tensors)
    nextn = f.get(Keys.LLM.NEXTN_PREDICT_LAYERS, int, 0)  # the last nextn blocks are MTP layers
    if not 0 <= nextn < blocks:
        raise where(f.path, f"nextn_predict_layers {nextn} leaves none of the {blocks} blocks to the model")
    n = blocks - nextn
    recurrent = f.get("{arch}.attention.recurrent_layers", list, None)
    if recurrent is None:
        interval = f.get(Keys.LLM.FULL_ATTENTION_INTERVAL, int, 4)
        if interval <= 0:
            raise where(f.path, f"full_attention_interval {interval}: it must be at least 1")
        recurrent = [(i + 1) % interval != 0 for i in range(n)]
    recurrent, mtp = recurrent[:n], recurrent[n:]
    if len(recurrent) != n or any(mtp) or not all(isinstance(r, bool) for r in recurrent + mtp):
        raise where(f.path, f"attention.recurrent_layers must say for each of the {n} layers whether it is recurrent"
                            f"{f' (and False for its {nextn} MTP layers)' if nextn else ''}")
    v_heads = f.get(Keys.SSM.TIME_STEP_RANK, int)
    inner = f.get(Keys.SSM.INNER_SIZE, int)
    if v_heads <= 0 or inner % v_heads:
        raise where(f.path, f"ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {v_heads}")
    try:
        shape = DeltaNetShape(k_heads=f.get(Keys.SSM.GROUP_COUNT, int), v_heads=v_heads,
                              k_dim=f.get(Keys.SSM.STATE_SIZE, int), v_dim=inner // v_heads,
                              conv_kernel=f.get(Keys.SSM.CONV_KERNEL, int))
    except ValueError as e:
        raise where(f.path, str(e)) from None
    return decoder_config_from_gguf(f, tensors, family, partial_rotary=True, attention=dict(qk_norm=True, gate=True),
                                    norms=dict(offset=True),
                                    layer_types=tuple(LINEAR if r else FULL for r in recurrent),
                                    linear_attention=shape, **experts_of(f, **(experts or {})), n_layers=n,
                                    mtp_layers=nextn, **specific)


def add_hybrid_hparams(w: GGUFWriter, c: DecoderConfig, arch: str, has: frozenset[Feature], feed_forward: bool = True) -> None:
    """What llama.cpp's converter writes for a Qwen hybrid, no more (``feed_forward``: the dense MLP's size,
    which Qwen3.5-MoE's config does not have)."""
    s = c.linear_attention
    if s is None:
        raise GptconvError(f"llama.cpp's {arch} is a hybrid: a model without linear-attention layers is not exported")
    if s.k_dim != s.v_dim:
        raise GptconvError(f"llama.cpp's {arch} has value heads as wide as key heads ({s.v_dim} against {s.k_dim}); "
                           "not exported")
    add_decoder_hparams(w, c, has=has, arch=arch, feed_forward=feed_forward)
    add_key_length(w, c, always=True)
    if c.experts:
        w.add_expert_feed_forward_length(c.experts.d_ff or c.d_ff)
        w.add_expert_shared_feed_forward_length(c.experts.shared_d_ff)
    if c.mtp_layers:
        w.add_nextn_predict_layers(c.mtp_layers)
    w.add_ssm_conv_kernel(s.conv_kernel)
    w.add_ssm_state_size(s.k_dim)
    w.add_ssm_group_count(s.k_heads)
    w.add_ssm_time_step_rank(s.v_heads)
    w.add_ssm_inner_size(s.v_dim * s.v_heads)
    w.add_array(f"{arch}.attention.recurrent_layers", [c.linear_at(i) for i in range(c.n_layers)] + [False] * c.mtp_layers)
    w.add_full_attention_interval(_interval(c))
    w.add_rope_dimension_count(c.rope.dim or c.head_dim)


def _interval(c: DecoderConfig) -> int:
    """Every how many layers one is full attention, where the layers say so regularly; else 4 (the
    converter's default, where a config has no full_attention_interval; llama.cpp reads recurrent_layers)."""
    full = [i for i in range(c.n_layers) if not c.linear_at(i)]
    n = full[0] + 1 if full else 4
    return n if full == list(range(n - 1, c.n_layers, n)) else 4

