"""Mistral (HF mistral; GGUF llama): the decoder with a sliding window on every layer (v0.1:
4096 positions; later versions none). llama.cpp's converter writes it as ``llama`` and drops the window
(llama.cpp then attends to everything); our export keeps the key so that reading the file back keeps it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import Keys

from ..convert.gguf_decoder import (add_llama_hparams, decoder_config_from_gguf, decoder_gguf_keymap, standard_layer,
                                    window_of)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, window_on_every_layer
from ..convert.hf_keys import ATTENTION, DECODER_HF_STEPS, MLP, NORMS, decoder_hf_keymap
from ..describe import describe_decoder
from ..layers.decoder import Decoder, DecoderConfig
from ..layers.rope import Rotary
from ..layers.attention import AttentionOptions
from .base import Family, Preset, Wrapper

if TYPE_CHECKING:
    from ..sources.gguf_file import GGUFFields

_V01 = Preset(DecoderConfig(vocab_size=32000, context_length=32768, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                          d_ff=14336, rope=Rotary(theta=10000.0), attention=AttentionOptions(window=4096),
                          bos_token_id=1, eos_token_id=2, family="mistral"), "mistralai/Mistral-7B-v0.1")
PRESETS: dict[str, Preset] = {"mistral-7b": _V01, "mistral-7b-v0.1": _V01}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    return decoder_config_from_hf(f, "mistral", {}, window=window_on_every_layer(f, 4096))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    return decoder_config_to_hf(c, "mistral", "MistralForCausalLM")


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    return decoder_config_from_gguf(f, tensors, "mistral", window=window_of(f))


FAMILY = Family(
    name="mistral", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("mistral",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "mistral", NORMS + ATTENTION + MLP),
    gguf_arch="llama", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "llama", standard_layer(permuted=True)),
    gguf_metadata=lambda w, c: add_llama_hparams(w, c, key_length_always=True),
    # a llama file with a window and no experts (our export keeps the window; llama.cpp's drops it)
    claims_gguf=lambda f: (not f.get(Keys.LLM.EXPERT_COUNT, int, 0)
                           and bool(f.get(Keys.Attention.SLIDING_WINDOW, int, 0))),
    transformers_reads_gguf_as=("llama", "LlamaForCausalLM"),  # its names are Mistral's too
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"add_prefix_space_from_config": True},
    # Mistral Small 3.x: the text model of the multimodal checkpoint (Pixtral vision tower, projector)
    wrappers=(Wrapper("mistral3", ("mistral",), left_out=("vision_tower.", "multi_modal_projector.",
                                                           "model.vision_tower.", "model.multi_modal_projector.")),),
)
