"""gpt-oss (HF gpt_oss; GGUF gpt-oss): the decoder with biases on q, k, v and the output, a learned
sink logit per head in every attention softmax, 128-token windows on every other layer (from the first), YaRN
(factor 32 over 4,096 positions, its ramp not rounded out), and routed experts on every layer: a router with a
bias picks the top k by logit and weighs them by the softmax of those k; each expert is a clamped SwiGLU with
biases, (clamp(up, ±7) + 1) · g · σ(1.702 · g), g = min(gate, 7).

HF files store a layer's experts as four tensors: ``gate_up_proj`` (E, d, 2·d_ff) with gate and up columns
interleaved (gate, up, gate, up, …), its bias (E, 2·d_ff), ``down_proj`` (E, d_ff, d) and its bias; the
released checkpoints store the two matrices in MXFP4 (``*_blocks`` + ``*_scales``), read dequantized
(``sources/quantized.py``). llama.cpp's gpt-oss: the experts stacked per matrix (gate and up apart), the
pre-MLP norm named ``post_attention_norm``, the sinks as ``attn_sinks``; its converter keeps MXFP4 experts
MXFP4, and so does our export of an MXFP4 source.

Where the two runtimes differ: llama.cpp rounds YaRN's ramp edges out to whole dimensions (all its models),
where gpt-oss's own RoPE does not (``truncate: false``): a GGUF file runs llama.cpp's RoPE, and reads back so.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from gguf import Keys

from ..convert.gguf_decoder import (add_decoder_hparams, add_key_length, add_yarn_scaling, decoder_config_from_gguf,
                                    decoder_gguf_keymap, standard_layer)
from ..convert.gguf_meta import T, block_count, gguf_name
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, windows_of_layer_types
from ..convert.hf_keys import ATTENTION, DECODER_HF_STEPS, NORMS, decoder_hf_keymap
from ..describe import describe_decoder
from ..convert.keymap import Fuse, Fused, KeyMap, Map, Stacked
from ..errors import GptconvError, where
from ..layers.decoder import FULL, Feature, Decoder, DecoderConfig, SLIDING
from ..layers.mlp import Experts
from ..layers.rope import RopeScaling, Rotary
from ..layers.attention import AttentionOptions
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

LIMIT, ALPHA = 7.0, 1.702  # the clamped SwiGLU's, as llama.cpp hard-codes them


def _gpt_oss(vocab: int, layers: int, experts: int, **sizes: Any) -> DecoderConfig:
    return DecoderConfig(vocab_size=vocab, context_length=131072, d_model=2880, n_layers=layers, n_heads=64,
                       n_kv_heads=8, d_ff=2880, head_dim=64,
                       rope=Rotary(theta=150000.0, scaling=RopeScaling("yarn", factor=32.0, original_context_length=4096,
                                                attention_factor=0.1 * math.log(32.0) + 1.0,
                                                truncate=False)),
                       attention=AttentionOptions(qkv_bias=True, o_bias=True, window=128, sinks=True),
                       layer_types=_alternating(layers),
                       experts=Experts(experts, 4, router_bias=True, clamp=LIMIT, alpha=ALPHA), bos_token_id=199998,
                       eos_token_id=200002, family="gpt_oss", **sizes)


def _alternating(n: int) -> tuple[str, ...]:
    """transformers' default: a window on the even layers (the first, the third, …), none on the odd ones."""
    return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n))


PRESETS: dict[str, Preset] = {
    # openai/gpt-oss-20b: 24 layers of 2880, 64 heads of 64 (8 K/V), 32 experts of 2880, 4 per token
    "gpt-oss-20b": Preset(_gpt_oss(201088, 24, 32), "openai/gpt-oss-20b"),
    # openai/gpt-oss-120b: 36 layers, 128 experts
    "gpt-oss-120b": Preset(_gpt_oss(201088, 36, 128), "openai/gpt-oss-120b"),
}

_HAS = frozenset({Feature.LAYER_TYPES, Feature.YARN, Feature.ROUTER_BIAS, Feature.CLAMPED_EXPERTS, Feature.SINKS})


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    n = f.int("num_hidden_layers")
    bias = f.bool("attention_bias", True)
    types = f.data.get("layer_types") or list(_alternating(n))
    named = {k: f.positive(k, None) for k in ("num_experts", "num_local_experts")}
    if None not in named.values() and len(set(named.values())) > 1:
        raise f.error(f"num_experts {named['num_experts']} and num_local_experts {named['num_local_experts']} differ")
    return decoder_config_from_hf(f, "gpt_oss", {"rms_norm_eps": 1e-5, "rope_theta": 150000.0},
                                  attention=dict(qkv_bias=bias, o_bias=bias, sinks=True),
                                  **windows_of_layer_types(ConfigFields({**f.data, "layer_types": types}, origin), types),
                                  experts=Experts(named["num_local_experts"] or named["num_experts"] or 128,
                        f.positive("num_experts_per_tok", 4), renormalise=True, router_bias=True,
                        clamp=f.float("swiglu_limit", LIMIT), alpha=f.float("swiglu_alpha", ALPHA)))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    _check(c, "HF's gpt_oss")
    out = decoder_config_to_hf(c, "gpt_oss", "GptOssForCausalLM", biases=(c.attention.qkv_bias, c.attention.o_bias, False),
                               experts=True, has=_HAS)
    out.pop("mlp_bias")
    out.update(num_local_experts=c.experts.count, num_experts_per_tok=c.experts.used, swiglu_limit=c.experts.clamp,
               swiglu_alpha=c.experts.alpha, layer_types=[SLIDING if c.window(i) else FULL for i in range(c.n_layers)])
    return out


def _check(c: DecoderConfig, where_to: str, limits: bool = False) -> None:
    """What gpt-oss's layer always is: the sinks, the router's bias, the clamped experts on every layer, the
    chosen weights summing to 1, q/k/v and output biases alike; ``limits``: llama.cpp's clamp and slope too."""
    e = c.experts
    if e is None:
        raise ValueError(f"{where_to} has no place for a model without routed experts")
    problems = [what for what, bad in (
        ("attention without sinks", not c.attention.sinks), ("a router without a bias", not e.router_bias),
        ("experts other than the clamped SwiGLU", e.clamp is None),
        ("dense layers among experts", bool(c.moe_layers)), ("unnormalised expert weights", not e.renormalise),
        ("q/k/v biases without output biases or the reverse", c.attention.qkv_bias != c.attention.o_bias),
        ("an expert size other than intermediate_size", bool(e.d_ff) and e.d_ff != c.d_ff),
        (f"a SwiGLU clamp / slope other than {LIMIT:g} / {ALPHA:g}",
         limits and (e.clamp, e.alpha) != (LIMIT, ALPHA))) if bad]
    if problems:
        raise ValueError(f"{where_to} has no place for {problems[0]}")


def _interleaved() -> Fuse:
    """A layer's (E, d, 2·d_ff) tensor (or its (E, 2·d_ff) bias) of gate and up columns interleaved, as the
    parts [gate 0, up 0, gate 1, up 1, …], each (d_ff, d) (or (d_ff,)), as nn.Linear holds them (views)."""
    def split(t: torch.Tensor, c: DecoderConfig) -> list[torch.Tensor]:
        return [p.transpose(0, -1) for e in t.unbind(0) for p in (e[..., 0::2], e[..., 1::2])]

    def join(ts: list[torch.Tensor], c: DecoderConfig) -> torch.Tensor:
        return torch.stack([torch.stack((ts[k].transpose(0, -1), ts[k + 1].transpose(0, -1)), -1).flatten(-2)
                            for k in range(0, len(ts), 2)])

    def shapes(s: tuple[int, ...], c: DecoderConfig) -> list[tuple[int, ...]]:
        ff = c.experts.d_ff or c.d_ff
        if len(s) not in (2, 3) or s[-1] != 2 * ff:
            return [s]  # cannot be split so: the ledger reports the shape
        return [(ff, *s[1:-1])] * (2 * s[0])
    return Fuse("interleaved_gate_up", split, join, shapes)


# each expert's down matrix: HF's (E, d_ff, d), ours (d, d_ff) per expert
_DOWN = Fuse("experts_down_transposed", lambda t, c: [e.t() for e in t.unbind(0)],
             lambda ts, c: torch.stack([e.t() for e in ts]),
             lambda s, c: [(s[2], s[1])] * s[0] if len(s) == 3 else [s])
_GATE_UP = _interleaved()


def hf_keymap(c: DecoderConfig) -> KeyMap:
    experts = range(c.experts.count)
    gate_up = lambda part: [f"blocks.{{i}}.mlp.experts.{j}.{w}.{part}" for j in experts for w in ("gate", "up")]  # noqa: E731
    rows = [Fused("model.layers.{i}.mlp.experts.gate_up_proj", gate_up("weight"), _GATE_UP),
            Fused("model.layers.{i}.mlp.experts.gate_up_proj_bias", gate_up("bias"), _GATE_UP),
            Fused("model.layers.{i}.mlp.experts.down_proj", [f"blocks.{{i}}.mlp.experts.{j}.down.weight"
                                                            for j in experts], _DOWN),
            Stacked("model.layers.{i}.mlp.experts.down_proj_bias", "blocks.{i}.mlp.experts.{j}.down.bias",
                    lambda c: c.experts.count)]
    layer = NORMS + ATTENTION + [("self_attn.sinks", "attn.sinks"), ("mlp.router.weight", "mlp.router.weight"),
                                 ("mlp.router.bias", "mlp.router.bias")]
    return decoder_hf_keymap(c, "gpt_oss", layer, rows)


def gguf_keymap(c: DecoderConfig) -> KeyMap:
    """llama.cpp's gpt-oss: q and k in HF's rotate-half order (no permutation), the pre-MLP norm named
    post_attention_norm, each layer's experts stacked per matrix and per bias."""
    experts = [Stacked(gguf_name(src, p), f"blocks.{{i}}.mlp.experts.{{j}}.{dst}.{p}", lambda c: c.experts.count)
               for src, dst in ((T.FFN_GATE_EXP, "gate"), (T.FFN_UP_EXP, "up"), (T.FFN_DOWN_EXP, "down"))
               for p in ("weight", "bias")]
    return decoder_gguf_keymap(c, "gpt-oss", [
        *standard_layer(permuted=False, mlp=False),  # q, k, v, output: weights and biases
        Map(gguf_name(T.ATTN_SINKS), "blocks.{i}.attn.sinks"),
        Map(gguf_name(T.FFN_GATE_INP), "blocks.{i}.mlp.router.weight"),
        Map(gguf_name(T.FFN_GATE_INP, "bias"), "blocks.{i}.mlp.router.bias"),
        *experts], norm2=T.ATTN_POST_NORM)


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """llama.cpp's gpt-oss: a window on the even layers, the clamp and slope it hard-codes, its YaRN (the
    ramp's edges rounded out, as it runs every model's)."""
    n = block_count(f, tensors)
    window = f.get(Keys.Attention.SLIDING_WINDOW, int, 0)
    if not window:
        raise where(f.path, "gpt-oss without a sliding_window")
    experts = f.get(Keys.LLM.EXPERT_COUNT, int, 0)
    if not experts:
        raise where(f.path, "gpt-oss without expert_count")
    d_ff = f.get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int)
    return decoder_config_from_gguf(f, tensors, "gpt_oss", d_ff=d_ff, window=window, layer_types=_alternating(n),
                                    attention=dict(sinks=True),
                                    experts=Experts(experts, f.get(Keys.LLM.EXPERT_USED_COUNT, int), renormalise=True,
                                                    router_bias=True, clamp=LIMIT, alpha=ALPHA))


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter: the generic keys, the key length, YaRN, the window and the experts' size."""
    try:
        _check(c, "llama.cpp's gpt-oss", limits=True)
    except ValueError as e:
        raise GptconvError(f"{e}; not exported") from None
    if c.layer_types != _alternating(c.n_layers):
        raise GptconvError("llama.cpp's gpt-oss has windows on the even layers only; not exported")
    add_decoder_hparams(w, c, has=_HAS, arch="gpt-oss")
    add_key_length(w, c, always=True)
    add_yarn_scaling(w, c, rounds_ramp=True, attn_factor=False)
    w.add_sliding_window(c.attention.window)
    w.add_expert_feed_forward_length(c.experts.d_ff or c.d_ff)


FAMILY = Family(
    name="gpt_oss", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("gpt_oss",), config_from_hf=config_from_hf, config_to_hf=config_to_hf, hf_keymap=hf_keymap,
    gguf_arch="gpt-oss", config_from_gguf=config_from_gguf, gguf_keymap=gguf_keymap, gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={},
)
