"""Phi-3 (HF phi3; GGUF phi3): the Llama decoder with q, k, v stored as one ``qkv_proj`` and gate, up as
one ``gate_up_proj`` (rows one after the other), in both formats; Phi-3-mini windows every layer (2047).
llama.cpp's phi3 rotates halves as HF does. Partial rotary (Phi-4-mini) and longrope are refused.
"""

from __future__ import annotations

from typing import Any

from ..convert.gguf_decoder import (add_decoder_hparams, add_linear_scaling, decoder_config_from_gguf,
                                    decoder_gguf_keymap, refuse_experts, window_of)
from ..convert.gguf_meta import T, gguf_name
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import (DECODER_HF_STEPS, NORMS, decoder_config_from_hf, decoder_config_to_hf,
                                  decoder_hf_keymap, describe_decoder, window_on_every_layer)
from ..convert.keymap import Fused, KeyMap, Map, concat
from ..layers.decoder import Llama, LlamaConfig
from .base import Family, Preset

PRESETS: dict[str, Preset] = {
    "phi-3-mini": Preset(LlamaConfig(vocab_size=32064, context_length=4096, d_model=3072, n_layers=32, n_heads=32,
                                     n_kv_heads=32, d_ff=8192, rope_theta=10000.0, sliding_window=2047,
                                     bos_token_id=1, eos_token_id=32000, family="phi3"),
                         "microsoft/Phi-3-mini-4k-instruct"),
}

def config_from_hf(data: dict[str, Any], origin: object) -> LlamaConfig:
    f = ConfigFields(data, origin)
    return decoder_config_from_hf(f, "phi3", {"rms_norm_eps": 1e-5}, sliding_window=window_on_every_layer(f, None))

def config_to_hf(c: LlamaConfig) -> dict[str, Any]:
    return decoder_config_to_hf(c, "phi3", "Phi3ForCausalLM")

SPLIT_QKV = concat("split_qkv", lambda c: [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                                           c.n_kv_heads * c.head_dim])
SPLIT_GATE_UP = concat("split_gate_up", lambda c: [c.d_ff, c.d_ff])
_FUSED = [Fused("model.layers.{i}.self_attn.qkv_proj.weight", [f"blocks.{{i}}.attn.{n}.weight" for n in "qkv"],
                SPLIT_QKV),
          Fused("model.layers.{i}.mlp.gate_up_proj.weight", ["blocks.{i}.mlp.gate.weight", "blocks.{i}.mlp.up.weight"],
                SPLIT_GATE_UP)]
_LAYER = NORMS + [("self_attn.o_proj.weight", "attn.o.weight"), ("mlp.down_proj.weight", "mlp.down.weight")]

def hf_keymap(c: LlamaConfig, module: bool = False) -> KeyMap:
    return decoder_hf_keymap(c, "phi3", _LAYER, _FUSED, fused_first=module)

# llama.cpp keeps HF's fusions: attn_qkv, and ffn_up holding gate then up
_GGUF_LAYER = [Fused(gguf_name(T.ATTN_QKV), [f"blocks.{{i}}.attn.{n}.weight" for n in "qkv"], SPLIT_QKV),
               Fused(gguf_name(T.FFN_UP), ["blocks.{i}.mlp.gate.weight", "blocks.{i}.mlp.up.weight"], SPLIT_GATE_UP),
               Map(gguf_name(T.ATTN_OUT), "blocks.{i}.attn.o.weight"),
               Map(gguf_name(T.FFN_DOWN), "blocks.{i}.mlp.down.weight")]

def config_from_gguf(f: Any, tensors: dict) -> LlamaConfig:
    refuse_experts(f)
    return decoder_config_from_gguf(f, tensors, "phi3", fused_qkv=True, sliding_window=window_of(f))

def gguf_metadata(w: Any, c: LlamaConfig) -> None:
    add_decoder_hparams(w, c, rope_dims=True, original_context=True)
    w.add_sliding_window(c.sliding_window or 0)  # 0: none (Phi-4)
    add_linear_scaling(w, c)

FAMILY = Family(
    name="phi3", config_class=LlamaConfig, model_class=Llama, presets=PRESETS,
    hf_model_types=("phi3",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=hf_keymap, hf_module_keymap=lambda c: hf_keymap(c, module=True),
    gguf_arch="phi3", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "phi3", _GGUF_LAYER),
    gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    # llama.cpp strips the space after special tokens (but <unk>, <s>, <|endoftext|>) for a file so named
    gguf_vocab={"rstrip_special_when_named": ("phi-3", "phi3")},
)
