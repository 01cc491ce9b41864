"""Granite 3.x (HF granite; GGUF granite): the decoder with µP multipliers: the token embedding
× ``embedding_multiplier``, each sublayer's output × ``residual_multiplier`` before the residual add,
attention scores × ``attention_multiplier`` (in place of head_dim^-½), the logits ÷ ``logits_scaling``.
transformers' defaults are 1.0 for all four (an attention scale of 1, not head_dim^-½). llama.cpp's
granite rotates interleaved pairs, so its Q and K rows are permuted as llama's; it has no head_dim
apart from d / heads (its converter drops the field).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import Keys

from ..convert.gguf_decoder import (add_decoder_hparams, add_linear_scaling, add_window, decoder_config_from_gguf,
                                    decoder_gguf_keymap, refuse_experts, standard_layer)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, no_window
from ..convert.hf_keys import ATTENTION, DECODER_HF_STEPS, MLP, NORMS, decoder_hf_keymap
from ..describe import describe_decoder
from ..errors import GptconvError, where
from ..layers.decoder import Feature, Decoder, DecoderConfig
from ..layers.multipliers import Multipliers
from ..layers.rope import Rotary
from ..layers.norms import Norms
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

PRESETS: dict[str, Preset] = {
    # ibm-granite/granite-3.3-2b-base: 40 layers of 2048, 32 heads sharing 8 K/V heads, tied
    "granite-3.3-2b": Preset(DecoderConfig(vocab_size=49159, context_length=131072, d_model=2048, n_layers=40,
                                         n_heads=32, n_kv_heads=8, d_ff=8192, norms=Norms(eps=1e-5),
                                         rope=Rotary(theta=10000000.0), tie_embeddings=True,
                                         multipliers=Multipliers(12.0, 0.22, 0.015625, 8.0), bos_token_id=0,
                                         eos_token_id=0, family="granite"), "ibm-granite/granite-3.3-2b-base"),
}

_HAS = frozenset({Feature.MUP})
# the multipliers: ours (``Multipliers``' fields), HF's name, llama.cpp's key (each optional in llama.cpp but the
# logit scale)
_MULTIPLIERS = (("embedding", "embedding_multiplier", Keys.LLM.EMBEDDING_SCALE),
                ("residual", "residual_multiplier", Keys.LLM.RESIDUAL_SCALE),
                ("attention", "attention_multiplier", Keys.Attention.SCALE),
                ("logits", "logits_scaling", Keys.LLM.LOGIT_SCALE))


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    no_window(f)
    bias = f.bool("attention_bias", False)
    return decoder_config_from_hf(f, "granite", {}, attention=dict(qkv_bias=bias, o_bias=bias),
                                  mlp=dict(bias=f.bool("mlp_bias", False)),
                                  multipliers=Multipliers(**{ours: f.float(hf, 1.0) for ours, hf, _ in _MULTIPLIERS}))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(c, "granite", "GraniteForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, c.mlp.bias),
                               window=False, has=_HAS)
    out.update({hf: getattr(c.multipliers, ours) for ours, hf, _ in _MULTIPLIERS})
    if c.multipliers.attention is None:  # HF's granite has no "head_dim^-½": its default is 1
        out["attention_multiplier"] = c.head_dim ** -0.5
    return out


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """As llama.cpp runs a granite file: a scale absent (or 0) is not applied (the attention's is then
    head_dim^-½); the logit scale is required."""
    refuse_experts(f)
    scales = {ours: f.get(key, float, 0.0) or None for ours, _, key in _MULTIPLIERS}
    if scales["logits"] is None:
        raise where(f.path, f"missing metadata key '{Keys.LLM.LOGIT_SCALE.format(arch=f.arch)}' (llama.cpp requires it)")
    attention = scales.pop("attention")
    return decoder_config_from_gguf(f, tensors, "granite", multipliers=Multipliers(
        attention=attention, **{k: v or 1.0 for k, v in scales.items()}))


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter (its llama's keys, no key length, then the four scales)."""
    if c.head_dim != c.d_model // c.n_heads:
        raise GptconvError("llama.cpp's granite has no head_dim other than d / heads; not exported")
    add_decoder_hparams(w, c, vocab_size=True, rope_dims=True, has=_HAS, arch="granite")
    add_window(w, c, "granite", kept=False)
    add_linear_scaling(w, c)
    m = c.multipliers
    if m.attention is not None:
        w.add_attention_scale(m.attention)
    w.add_embedding_scale(m.embedding)
    w.add_residual_scale(m.residual)
    w.add_logit_scale(m.logits)


FAMILY = Family(
    name="granite", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("granite",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "granite", NORMS + ATTENTION + MLP),
    gguf_arch="granite", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "granite", standard_layer(permuted=True)),
    gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"add_prefix_space_from_config": True},
)
