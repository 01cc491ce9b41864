"""Qwen3 dense (HF qwen3; GGUF qwen3): the decoder with an RMSNorm on each head of q and k
before RoPE, optional q/k/v/output biases (``attention_bias``), 8 K/V heads of 128 in the released
sizes. llama.cpp's qwen3 rotates halves as HF does: no Q/K permutation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..convert.gguf_decoder import (QK_NORM as GGUF_QK_NORM, add_decoder_hparams, add_key_length, add_linear_scaling,
                                    add_window, decoder_config_from_gguf, decoder_gguf_keymap, refuse_experts,
                                    standard_layer, window_of)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, window_where_enabled, windows_to_hf
from ..convert.hf_keys import ATTENTION, DECODER_HF_STEPS, MLP, NORMS, QK_NORM, decoder_hf_keymap
from ..describe import describe_decoder
from ..layers.decoder import Feature, Decoder, DecoderConfig
from ..layers.rope import Rotary
from ..layers.norms import Norms
from ..layers.attention import AttentionOptions
from .base import Family, Preset, Wrapper

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields


def _dense(d_model: int, n_layers: int, n_heads: int, d_ff: int, tie: bool) -> DecoderConfig:
    """The dense models share all but their sizes: 8 K/V heads of 128, QK-norm, no biases."""
    return DecoderConfig(vocab_size=151936, context_length=40960, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                       n_kv_heads=8, d_ff=d_ff, head_dim=128, norms=Norms(eps=1e-6), rope=Rotary(theta=1000000.0),
                       tie_embeddings=tie, attention=AttentionOptions(qk_norm=True), bos_token_id=151643,
                       eos_token_id=151645, family="qwen3")


PRESETS: dict[str, Preset] = {
    "qwen3-0.6b": Preset(_dense(d_model=1024, n_layers=28, n_heads=16, d_ff=3072, tie=True), "Qwen/Qwen3-0.6B"),
    "qwen3-1.7b": Preset(_dense(d_model=2048, n_layers=28, n_heads=16, d_ff=6144, tie=True), "Qwen/Qwen3-1.7B"),
    "qwen3-4b": Preset(_dense(d_model=2560, n_layers=36, n_heads=32, d_ff=9728, tie=True), "Qwen/Qwen3-4B"),
    "qwen3-8b": Preset(_dense(d_model=4096, n_layers=36, n_heads=32, d_ff=12288, tie=False), "Qwen/Qwen3-8B"),
}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    bias = f.bool("attention_bias", False)
    return decoder_config_from_hf(f, "qwen3", {}, attention=dict(qkv_bias=bias, o_bias=bias, qk_norm=True),
                                  **window_where_enabled(f, max_window_layers=28))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    return {**decoder_config_to_hf(c, "qwen3", "Qwen3ForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, False),
                                   qk_norm=True, has={Feature.LAYER_TYPES}),
            **windows_to_hf(c)}


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    refuse_experts(f)
    return decoder_config_from_gguf(f, tensors, "qwen3", window=window_of(f), attention=dict(qk_norm=True))


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    add_decoder_hparams(w, c)
    add_window(w, c, "qwen3", kept=False)
    add_key_length(w, c, always=True)
    add_linear_scaling(w, c)


FAMILY = Family(
    name="qwen3", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("qwen3",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "qwen3", NORMS + ATTENTION + MLP + QK_NORM),
    gguf_arch="qwen3", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "qwen3", standard_layer(permuted=False) + GGUF_QK_NORM),
    gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"pre_tokenizer_first": "qwen2"},
    # Qwen3-VL: its text model's M-RoPE gives the t, h and w sections of the frequencies three position
    # streams; text-only ids have the three equal, so it is Qwen3's plain RoPE (deepstack adds image
    # features only): verify compares ours with transformers' whole Qwen3-VL on text
    wrappers=(Wrapper("qwen3_vl", ("qwen3_vl_text",), left_out=("model.visual.", "visual."),
                      left_out_what="the vision tower and its mergers"),),
)
