"""Qwen3.5 / 3.6 dense (HF qwen3_5_text, and the text model of the multimodal qwen3_5; GGUF qwen35): a
hybrid decoder. Three of every four layers are linear attention (a gated delta rule with a recurrent
state, ``layers/linear_attention.py``), the fourth is full attention whose output is gated by
sigmoid(gate(x)) (the gate's rows sit beside each head's q rows in q_proj), with RMSNorm on each q and k
head and RoPE on the first quarter of each head. Every RMSNorm but the linear layers' gated one scales by
1 + w. The M-RoPE of the multimodal model gives three position streams sections of the frequencies; for
text all three are the token's position, which is plain RoPE (a test shows it).

The checkpoints ship multi-token-prediction layers (``mtp.*``): a draft head for speculative decoding
that the next-token trace does not run. The model holds them (``layers/mtp.py``), the summary lists them,
and export writes them back (GGUF: as llama.cpp's converter does, ``convert/mtp.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..convert.gguf_hybrid import add_hybrid_hparams, add_mrope_sections, hybrid_config_from_gguf, hybrid_gguf_keymap
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_to_hf
from ..convert.hf_keys import DECODER_HF_STEPS, MLP, NORMS, decoder_hf_keymap
from ..describe import describe_decoder
from ..convert.mtp import with_hf_mtp_layers
from ..convert.hf_hybrid import (GATED_ATTENTION, GATED_Q, LINEAR_ATTENTION, LINEAR_CONV, hybrid_config_from_hf,
                                 hybrid_to_hf)
from ..layers.decoder import Feature, Decoder, DecoderConfig
from ..layers.linear_attention import DeltaNetShape
from ..layers.rope import Rotary
from ..layers.norms import Norms
from ..layers.attention import AttentionOptions
from .base import Family, Preset, Wrapper

if TYPE_CHECKING:
    from gguf import GGUFWriter

PRESETS: dict[str, Preset] = {
    # Qwen/Qwen3.5-0.8B: 24 layers of 1024 (3 linear : 1 full), 8 query heads and 2 K/V heads of 256 with RoPE
    # on 64 of them; linear layers of 16 key and 16 value heads of 128; tied
    "qwen3.5-0.8b": Preset(DecoderConfig(vocab_size=248320, context_length=262144, d_model=1024, n_layers=24, n_heads=8,
                                       n_kv_heads=2, d_ff=3584, head_dim=256, norms=Norms(eps=1e-6, offset=True),
                                       rope=Rotary(theta=10000000.0, dim=64), tie_embeddings=True,
                                       attention=AttentionOptions(qk_norm=True, gate=True),
                                       layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(24)),
                                       linear_attention=DeltaNetShape(k_heads=16, v_heads=16, k_dim=128, v_dim=128, conv_kernel=4),
                                       eos_token_id=248044, family="qwen3_5"), "Qwen/Qwen3.5-0.8B"),
}

_HAS = frozenset({Feature.LAYER_TYPES, Feature.LINEAR_ATTENTION, Feature.ATTENTION_GATE, Feature.OFFSET_NORMS, Feature.PARTIAL_ROTARY,
                  Feature.MTP})


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    return hybrid_config_from_hf(ConfigFields(data, origin), "qwen3_5")


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    return {**decoder_config_to_hf(c, "qwen3_5_text", "Qwen3_5ForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, False),
                                   window=False, qk_norm=True, has=_HAS),
            **hybrid_to_hf(c)}


def hf_keymap(c: DecoderConfig):
    return decoder_hf_keymap(c, "qwen3_5", NORMS + MLP + GATED_ATTENTION + LINEAR_ATTENTION, [GATED_Q, LINEAR_CONV],
                             mtp=True)


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    add_hybrid_hparams(w, c, "qwen35", has=_HAS)
    add_mrope_sections(w, c, "qwen35")


FAMILY = Family(
    name="qwen3_5", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("qwen3_5_text",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=hf_keymap, config_from_hf_tensors=with_hf_mtp_layers,
    gguf_arch="qwen35", config_from_gguf=lambda f, tensors: hybrid_config_from_gguf(f, tensors, "qwen3_5"),
    gguf_keymap=lambda c: hybrid_gguf_keymap(c, "qwen35", tiled=True), gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"pre_tokenizer_first": "qwen2"},
    wrappers=(Wrapper("qwen3_5", ("qwen3_5_text",), left_out=("model.visual.", "visual."),
                      left_out_what="the vision tower and its mergers"),),
)
