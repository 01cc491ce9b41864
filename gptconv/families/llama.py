"""Llama (HF llama; GGUF llama): Llama 2, 3, 3.1, 3.2, TinyLlama, SmolLM2.

The decoder (``layers/decoder.py``) as it is, optional biases (``attention_bias``, ``mlp_bias``)
and llama3 or linear RoPE scaling. llama.cpp's ``llama`` rotates interleaved pairs, so its Q and K rows
are permuted from HF's rotate-half order (PERMUTE_Q / PERMUTE_K).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import Keys

from ..convert.gguf_decoder import add_llama_hparams, decoder_config_from_gguf, decoder_gguf_keymap, standard_layer
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, no_window
from ..convert.hf_keys import ATTENTION, DECODER_HF_STEPS, MLP, NORMS, decoder_hf_keymap
from ..describe import describe_decoder
from ..layers.decoder import Decoder, DecoderConfig
from ..layers.rope import RopeScaling, Rotary
from .base import Family, Preset

if TYPE_CHECKING:
    from ..sources.gguf_file import GGUFFields

_LLAMA31 = RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=8192)
_LLAMA32 = RopeScaling("llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=8192)
_META3 = dict(vocab_size=128256, n_kv_heads=8, bos_token_id=128000, eos_token_id=128001)  # RoPE base 500k
_SMOLLM2 = dict(vocab_size=49152, context_length=8192, tie_embeddings=True, bos_token_id=1, eos_token_id=2)

PRESETS: dict[str, Preset] = {
    "llama-2-7b": Preset(DecoderConfig(vocab_size=32000, context_length=4096, d_model=4096, n_layers=32, n_heads=32,
                                     n_kv_heads=32, d_ff=11008, rope=Rotary(theta=10000.0), bos_token_id=1,
                                     eos_token_id=2),
                         "meta-llama/Llama-2-7b-hf"),
    "llama-3-8b": Preset(DecoderConfig(context_length=8192, d_model=4096, n_layers=32, n_heads=32, d_ff=14336,
                                     rope=Rotary(500000.0), **_META3),
                         "meta-llama/Meta-Llama-3-8B"),
    "llama-3.1-8b": Preset(DecoderConfig(context_length=131072, d_model=4096, n_layers=32, n_heads=32, d_ff=14336,
                                       rope=Rotary(500000.0, _LLAMA31), **_META3), "meta-llama/Llama-3.1-8B"),
    "llama-3.2-1b": Preset(DecoderConfig(context_length=131072, d_model=2048, n_layers=16, n_heads=32, d_ff=8192,
                                       rope=Rotary(500000.0, _LLAMA32), tie_embeddings=True, head_dim=64, **_META3),
                           "meta-llama/Llama-3.2-1B"),
    "llama-3.2-3b": Preset(DecoderConfig(context_length=131072, d_model=3072, n_layers=28, n_heads=24, d_ff=8192,
                                       rope=Rotary(500000.0, _LLAMA32), tie_embeddings=True, head_dim=128, **_META3),
                           "meta-llama/Llama-3.2-3B"),
    "tinyllama-1.1b": Preset(DecoderConfig(vocab_size=32000, context_length=2048, d_model=2048, n_layers=22, n_heads=32,
                                         n_kv_heads=4, d_ff=5632, rope=Rotary(theta=10000.0), bos_token_id=1,
                                         eos_token_id=2),
                             "TinyLlama/TinyLlama-1.1B-Chat-v1.0"),
    "smollm2-135m": Preset(DecoderConfig(d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, d_ff=1536,
                                       rope=Rotary(theta=100000.0), **_SMOLLM2), "HuggingFaceTB/SmolLM2-135M"),
    "smollm2-360m": Preset(DecoderConfig(d_model=960, n_layers=32, n_heads=15, n_kv_heads=5, d_ff=2560,
                                       rope=Rotary(theta=100000.0), **_SMOLLM2), "HuggingFaceTB/SmolLM2-360M"),
    "smollm2-1.7b": Preset(DecoderConfig(d_model=2048, n_layers=24, n_heads=32, n_kv_heads=32, d_ff=8192,
                                       rope=Rotary(theta=130000.0), **_SMOLLM2), "HuggingFaceTB/SmolLM2-1.7B"),
}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    no_window(f)
    bias = f.bool("attention_bias", False)
    return decoder_config_from_hf(f, "llama", {}, attention=dict(qkv_bias=bias, o_bias=bias),
                                  mlp=dict(bias=f.bool("mlp_bias", False)))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    return decoder_config_to_hf(c, "llama", "LlamaForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, c.mlp.bias),
                                window=False)


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    return decoder_config_from_gguf(f, tensors, "llama")


FAMILY = Family(
    name="llama", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("llama",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "llama", NORMS + ATTENTION + MLP),
    gguf_arch="llama", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "llama", standard_layer(permuted=True)),
    gguf_metadata=lambda w, c: add_llama_hparams(w, c, key_length_always=True),
    # llama.cpp's llama is also Mistral's and Mixtral's: a file without a window or experts is Llama
    claims_gguf=lambda f: not f.get(Keys.LLM.EXPERT_COUNT, int, 0) and not f.get(Keys.Attention.SLIDING_WINDOW, int, 0),
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"add_prefix_space_from_config": True},
)
