"""Phi-3 (HF phi3; GGUF phi3): the decoder with q, k, v stored as one ``qkv_proj`` and gate, up as
one ``gate_up_proj`` (rows one after the other), in both formats; Phi-3-mini windows every layer (2047).
Phi-4-mini rotates the first 3/4 of each head (partial rotary) and stretches RoPE with longrope: short
factors while a forward reaches no further than the original context, long ones once it does (transformers'
rule, per forward call; llama.cpp decides once, by its context size: long whenever it exceeds the original).
llama.cpp's phi3 rotates halves as HF does; its GGUF holds the factors as two tensors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..convert.gguf_decoder import (add_decoder_hparams, add_linear_scaling, decoder_config_from_gguf,
                                    decoder_gguf_keymap, refuse_experts, window_of)
from ..convert.gguf_meta import T, gguf_name
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, window_on_every_layer
from ..convert.hf_rope import rope_parameters
from ..convert.hf_keys import DECODER_HF_STEPS, NORMS, decoder_hf_keymap
from ..describe import describe_decoder
from ..convert.keymap import Fused, KeyMap, Map, concat
from ..layers.decoder import Feature, Decoder, DecoderConfig
from ..layers.rope import RopeScaling, Rotary
from ..layers.attention import AttentionOptions
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

# microsoft/Phi-4-mini-instruct's longrope (config.json at revision cfbefacb99257ffa30c83adab238a50856ac3083,
# as a public repository records it): RoPE on 96 of 128 dimensions, 48 factors each, original context 4096
_PHI4_LONG = (1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649,
              2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533,
              5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651,
              14.64173252, 16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03,
              32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16,
              47.77)
_PHI4_ROPE = RopeScaling("longrope", factor=32.0, original_context_length=4096, factors=(1.0,) * 48,
                         long_factors=tuple(float(x) for x in _PHI4_LONG),
                         attention_factor=math.sqrt(1 + math.log(32) / math.log(4096)))  # transformers' default

PRESETS: dict[str, Preset] = {
    "phi-3-mini": Preset(DecoderConfig(vocab_size=32064, context_length=4096, d_model=3072, n_layers=32, n_heads=32,
                                     n_kv_heads=32, d_ff=8192, rope=Rotary(theta=10000.0),
                                     attention=AttentionOptions(window=2047), bos_token_id=1, eos_token_id=32000,
                                     family="phi3"),
                         "microsoft/Phi-3-mini-4k-instruct"),
    # a window of 262144 on every layer, past the context: none in effect
    "phi-4-mini": Preset(DecoderConfig(vocab_size=200064, context_length=131072, d_model=3072, n_layers=32, n_heads=24,
                                     n_kv_heads=8, d_ff=8192, rope=Rotary(theta=10000.0, scaling=_PHI4_ROPE, dim=96),
                                     tie_embeddings=True, attention=AttentionOptions(window=262144),
                                     bos_token_id=199999, eos_token_id=199999, family="phi3"),
                         "microsoft/Phi-4-mini-instruct"),
}

_HAS = frozenset({Feature.PARTIAL_ROTARY, Feature.LONGROPE})


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(_original_context_on_top(data, origin), origin)
    return decoder_config_from_hf(f, "phi3", {"rms_norm_eps": 1e-5}, window=window_on_every_layer(f, None),
                                  partial_rotary=True)


def _original_context_on_top(data: dict[str, Any], origin: object) -> dict[str, Any]:
    """transformers' Phi3Config has its own original_max_position_embeddings (4096 where absent), and it
    overrides the one inside a scaling's RoPE parameters; so here too (llama.cpp's converter reads the
    inner one first: a config whose two differ converts as another model)."""
    params = rope_parameters(ConfigFields(data, origin)).data
    if (params.get("rope_type") or params.get("type")) in (None, "default"):
        return data
    top = data.get("original_max_position_embeddings", 4096)
    return {**data, "rope_scaling": None,
            "rope_parameters": {**params, "original_max_position_embeddings": top}}


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(c, "phi3", "Phi3ForCausalLM", has=_HAS)
    if c.rope.scaling is not None and c.rope.scaling.kind == "longrope":  # where transformers' phi3 reads it
        out["original_max_position_embeddings"] = c.rope.scaling.original_context_length
    return out

SPLIT_QKV = concat("split_qkv", lambda c: [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                                           c.n_kv_heads * c.head_dim])
SPLIT_GATE_UP = concat("split_gate_up", lambda c: [c.d_ff, c.d_ff])
_FUSED = [Fused("model.layers.{i}.self_attn.qkv_proj.weight", [f"blocks.{{i}}.attn.{n}.weight" for n in "qkv"],
                SPLIT_QKV),
          Fused("model.layers.{i}.mlp.gate_up_proj.weight", ["blocks.{i}.mlp.gate.weight", "blocks.{i}.mlp.up.weight"],
                SPLIT_GATE_UP)]
_LAYER = NORMS + [("self_attn.o_proj.weight", "attn.o.weight"), ("mlp.down_proj.weight", "mlp.down.weight")]

def hf_keymap(c: DecoderConfig, module: bool = False) -> KeyMap:
    return decoder_hf_keymap(c, "phi3", _LAYER, _FUSED, fused_first=module)

# llama.cpp keeps HF's fusions: attn_qkv, and ffn_up holding gate then up
_GGUF_LAYER = [Fused(gguf_name(T.ATTN_QKV), [f"blocks.{{i}}.attn.{n}.weight" for n in "qkv"], SPLIT_QKV),
               Fused(gguf_name(T.FFN_UP), ["blocks.{i}.mlp.gate.weight", "blocks.{i}.mlp.up.weight"], SPLIT_GATE_UP),
               Map(gguf_name(T.ATTN_OUT), "blocks.{i}.attn.o.weight"),
               Map(gguf_name(T.FFN_DOWN), "blocks.{i}.mlp.down.weight")]

def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    refuse_experts(f)
    return decoder_config_from_gguf(f, tensors, "phi3", fused_qkv=True, window=window_of(f), partial_rotary=True)

def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter's keys; with longrope its attention factor too (the factors are tensors, written
    with the weights). The converter computes that factor from the context and the original one (as
    transformers does where the config gives none); we write the config's, which llama.cpp runs."""
    s = c.rope.scaling
    if s is not None and s.kind == "longrope":
        w.add_rope_scaling_attn_factors(s.attention_factor)
    add_decoder_hparams(w, c, rope_dims=True, original_context=True, has=_HAS, arch="phi3")
    w.add_sliding_window(c.attention.window or 0)  # 0: none (Phi-4)
    add_linear_scaling(w, c)

FAMILY = Family(
    name="phi3", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("phi3",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=hf_keymap, hf_module_keymap=lambda c: hf_keymap(c, module=True),
    gguf_arch="phi3", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "phi3", _GGUF_LAYER),
    gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    # llama.cpp strips the space after special tokens (but <unk>, <s>, <|endoftext|>) for a file so named
    gguf_vocab={"rstrip_special_when_named": ("phi-3", "phi3")},
)
