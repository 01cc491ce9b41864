"""LFM2 (HF lfm2; GGUF lfm2): a hybrid decoder of Liquid AI. Most layers mix positions by a gated short
convolution (``layers/short_conv.py``: out(C ⊙ conv(B ⊙ x)), a depthwise causal convolution over the last
``conv_L_cache`` positions), the others by attention with an RMSNorm on each q and k head before RoPE.
Every layer is pre-norm (HF: ``operator_norm`` before the mixer, ``ffn_norm`` before the SwiGLU MLP) and
the final norm is HF's ``embedding_norm`` (llama.cpp's ``token_embd_norm``), applied after the last layer
despite its name. The MLP's size is ``intermediate_size`` adjusted as transformers does
(``block_auto_adjust_ff_dim``: ⅔ of it, × ``block_ffn_dim_multiplier``, rounded up to
``block_multiple_of``); our export writes the adjusted size with the adjustment off.

llama.cpp's lfm2 rotates halves as HF does (no Q/K permutation), tells a conv layer by its 0 K/V heads in
a per-layer ``head_count_kv`` and has no biases on its conv layers (a config with them is not exported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import Keys

from ..convert.gguf_decoder import (QK_NORM as GGUF_QK_NORM, add_decoder_hparams, add_key_length, add_linear_scaling,
                                    decoder_config_from_gguf, decoder_gguf_keymap, refuse_experts, standard_layer)
from ..convert.gguf_meta import T, block_count, gguf_name
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf
from ..convert.hf_keys import DECODER_HF_STEPS, decoder_hf_keymap
from ..describe import describe_decoder
from ..convert.hf_hybrid import CONV as CONV_WEIGHT
from ..convert.keymap import Map
from ..errors import GptconvError, where
from ..layers.decoder import CONV, FULL, Feature, Decoder, DecoderConfig
from ..layers.short_conv import ShortConvShape
from ..layers.rope import Rotary
from ..layers.norms import Norms
from ..layers.attention import AttentionOptions
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

# LiquidAI/LFM2-350M: 16 layers of 1024, attention in 6 of them (2, 5, 8, 10, 12, 14: the indices are from
# memory and not checked; the count does not depend on them), 16 query heads sharing 8 K/V heads, a 3-tap
# conv, MLP 6656 → 4608, tied. 354,483,968 counted on meta (the Hub lists 354M); the context (128,000),
# RoPE base (1e6) and eos id (7) are from memory too.
_ATTENTION_350M = (2, 5, 8, 10, 12, 14)
PRESETS: dict[str, Preset] = {
    "lfm2-350m": Preset(DecoderConfig(vocab_size=65536, context_length=128000, d_model=1024, n_layers=16, n_heads=16,
                                    n_kv_heads=8, d_ff=4608, norms=Norms(eps=1e-5), rope=Rotary(theta=1000000.0),
                                    tie_embeddings=True, attention=AttentionOptions(qk_norm=True),
                                    layer_types=tuple(FULL if i in _ATTENTION_350M else CONV for i in range(16)),
                                    short_conv=ShortConvShape(3), bos_token_id=1, eos_token_id=7, family="lfm2"), "LiquidAI/LFM2-350M"),
}

_HAS = frozenset({Feature.LAYER_TYPES, Feature.SHORT_CONV})


def ffn_size(f: ConfigFields) -> int:
    """The MLP's hidden size as transformers' Lfm2MLP computes it (``block_ff_dim``, an older name, wins)."""
    size = f.positive("block_ff_dim", None) or f.positive("intermediate_size", 12288)
    if f.bool("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        multiplier = f.data.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:  # transformers rounds up only with a multiplier
            of = f.positive("block_multiple_of", 256)
            size = of * ((int(f.positive_float("block_ffn_dim_multiplier", 1.0) * size) + of - 1) // of)
    return size


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    n = f.int("num_hidden_layers")
    types = f.data.get("layer_types")
    if types is None:  # transformers: the layers full_attn_idxs lists attend (absent: all), the others convolve
        full = f.data.get("full_attn_idxs")
        full = range(n) if full is None else full
        types = [FULL if i in full else CONV for i in range(n)]
    if not isinstance(types, list) or len(types) != n or not all(t in (FULL, CONV) for t in types):
        raise f.error(f"layer_types must give full_attention or conv for each of the {n} layers")
    # LFM2's names for the decoder's fields (transformers reads tie_embedding before tie_word_embeddings)
    renamed = ConfigFields({**data, "intermediate_size": ffn_size(f), "rms_norm_eps": f.float("norm_eps", 1e-5),
                            "tie_word_embeddings": f.bool("tie_embedding", f.bool("tie_word_embeddings", True)),
                            "num_key_value_heads": f.int("num_key_value_heads", 8), "layer_types": types}, origin)
    try:
        conv = ShortConvShape(kernel=f.positive("conv_L_cache", 3), bias=f.bool("conv_bias", False))
    except ValueError as e:
        raise f.error(str(e)) from None
    return decoder_config_from_hf(renamed, "lfm2", {"rope_theta": 1000000.0}, attention=dict(qk_norm=True),
                                  layer_types=tuple(types), short_conv=conv if CONV in types else None)


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(c, "lfm2", "Lfm2ForCausalLM", window=False, qk_norm=True, has=_HAS)
    out["norm_eps"] = out.pop("rms_norm_eps")
    conv = c.short_conv or ShortConvShape()
    out.update(layer_types=[CONV if c.conv_at(i) else FULL for i in range(c.n_layers)], conv_L_cache=conv.kernel,
               conv_bias=conv.bias, block_auto_adjust_ff_dim=False)  # intermediate_size is the MLP's own
    return out


_CONV_LAYER = [("conv.in_proj", "attn.in_bcx"), ("conv.out_proj", "attn.out")]
_HF_LAYER = [
    ("operator_norm.weight", "norm1.weight"), ("ffn_norm.weight", "norm2.weight"),
    *((f"self_attn.{n}_proj.weight", f"attn.{n}.weight") for n in "qkv"), ("self_attn.out_proj.weight", "attn.o.weight"),
    ("self_attn.q_layernorm.weight", "attn.q_norm.weight"), ("self_attn.k_layernorm.weight", "attn.k_norm.weight"),
    *((f"{hf}.{p}", f"{ours}.{p}") for hf, ours in _CONV_LAYER for p in ("weight", "bias")),
    ("conv.conv.bias", "attn.conv.bias"),
    *((f"feed_forward.{hf}.weight", f"mlp.{ours}.weight") for hf, ours in (("w1", "gate"), ("w3", "up"), ("w2", "down"))),
]
_HF_CONV = Map("model.layers.{i}.conv.conv.weight", "blocks.{i}.attn.conv.weight", CONV_WEIGHT)


def hf_keymap(c: DecoderConfig):
    return decoder_hf_keymap(c, "lfm2", _HF_LAYER, [_HF_CONV], final_norm="model.embedding_norm.weight")


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """llama.cpp's lfm2: a layer with 0 K/V heads is a conv layer; the others share one K/V head count."""
    refuse_experts(f)
    if f.get(Keys.Attention.SLIDING_WINDOW, int, 0):
        raise where(f.path, "lfm2: a sliding window (llama.cpp's, on the attention layers) is not supported")
    kv = f.get(Keys.Attention.HEAD_COUNT_KV, list)
    heads = {k for k in kv if k}
    if len(kv) != block_count(f, tensors) or len(heads) > 1 or not all(isinstance(k, int) for k in kv):
        raise where(f.path, f"lfm2: head_count_kv must give each layer one K/V head count or 0 (a conv layer): {kv}")
    types = tuple(FULL if k else CONV for k in kv)
    conv = ShortConvShape(kernel=f.get(Keys.ShortConv.L_CACHE, int)) if CONV in types else None
    return decoder_config_from_gguf(f, tensors, "lfm2", n_kv_heads=heads.pop() if heads else 1,
                                    attention=dict(qk_norm=True), layer_types=types, short_conv=conv)


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter: the generic keys (K/V heads per layer, 0 on conv layers), the vocabulary size
    and the conv's kernel; the key length only where head_dim is not d / heads."""
    if c.short_conv is not None and c.short_conv.bias:
        raise GptconvError("llama.cpp's lfm2 has no biases on its conv layers; not exported")
    add_decoder_hparams(w, c, vocab_size=True, has=_HAS, arch="lfm2",
                        kv_heads=[0 if c.conv_at(i) else c.n_kv_heads for i in range(c.n_layers)])
    add_key_length(w, c, always=False)
    add_linear_scaling(w, c)
    w.add_shortconv_l_cache((c.short_conv or ShortConvShape()).kernel)


_GGUF_CONV = [Map(gguf_name(src), f"blocks.{{i}}.attn.{ours}.weight") for src, ours in (
    (T.SHORTCONV_CONV, "conv"), (T.SHORTCONV_INPROJ, "in_bcx"), (T.SHORTCONV_OUTPROJ, "out"))]


FAMILY = Family(
    name="lfm2", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("lfm2",), config_from_hf=config_from_hf, config_to_hf=config_to_hf, hf_keymap=hf_keymap,
    gguf_arch="lfm2", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "lfm2", standard_layer(permuted=False) + GGUF_QK_NORM + _GGUF_CONV,
                                              final_norm=T.TOKEN_EMBD_NORM),
    gguf_metadata=gguf_metadata,
    hf_steps={**DECODER_HF_STEPS, "final_norm": "model.embedding_norm"}, describe=describe_decoder,
)
