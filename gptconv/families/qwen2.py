"""Qwen2 / Qwen2.5 (HF qwen2; GGUF qwen2): the decoder with biases on q, k and v (none on the
output or the MLP). Sliding windows only with ``use_sliding_window``, on the layers ``layer_types`` says
(else from ``max_window_layers`` on); llama.cpp's qwen2 has none, so such a model is not exported to GGUF.
llama.cpp's qwen2 rotates halves as HF does: no Q/K permutation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..convert.gguf_decoder import (add_decoder_hparams, add_key_length, add_linear_scaling, add_window,
                                    decoder_config_from_gguf, decoder_gguf_keymap, refuse_experts, standard_layer,
                                    window_of)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, window_where_enabled, windows_to_hf
from ..convert.hf_keys import ATTENTION, DECODER_HF_STEPS, MLP, NORMS, decoder_hf_keymap
from ..describe import describe_decoder
from ..layers.decoder import Feature, Decoder, DecoderConfig
from ..layers.rope import Rotary
from ..layers.norms import Norms
from ..layers.attention import AttentionOptions
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

PRESETS: dict[str, Preset] = {
    "qwen2.5-0.5b": Preset(DecoderConfig(vocab_size=151936, context_length=32768, d_model=896, n_layers=24, n_heads=14,
                                       n_kv_heads=2, d_ff=4864, rope=Rotary(theta=1000000.0), tie_embeddings=True,
                                       attention=AttentionOptions(qkv_bias=True), norms=Norms(eps=1e-6),
                                       bos_token_id=151643, eos_token_id=151643, family="qwen2"), "Qwen/Qwen2.5-0.5B"),
}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    return decoder_config_from_hf(f, "qwen2", {}, attention=dict(qkv_bias=True, o_bias=False),
                                  **window_where_enabled(f, max_window_layers=28))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    return {**decoder_config_to_hf(c, "qwen2", "Qwen2ForCausalLM", biases=(True, False, False), has={Feature.LAYER_TYPES}),
            **windows_to_hf(c)}


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    refuse_experts(f)
    return decoder_config_from_gguf(f, tensors, "qwen2", window=window_of(f))


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    add_decoder_hparams(w, c)
    add_window(w, c, "qwen2", kept=False)
    add_key_length(w, c, always=False)
    add_linear_scaling(w, c)


FAMILY = Family(
    name="qwen2", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("qwen2",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "qwen2", NORMS + ATTENTION + MLP),
    gguf_arch="qwen2", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "qwen2", standard_layer(permuted=False)),
    gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"pre_tokenizer_first": "qwen2"},
)
