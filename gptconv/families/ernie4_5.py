"""ERNIE 4.5 dense (HF ernie4_5; GGUF ernie4_5): the decoder whose RoPE rotates interleaved pairs
(x₀, x₁), (x₂, x₃), … of each head, not its halves: llama.cpp's NORM RoPE, the order its llama files hold
q and k rows in. So no RoPE of its own: HF's q and k rows are reordered into our rotate-half order at load
(``INTERLEAVED_QK``, llama.cpp's llama permutation) and back at export; llama.cpp's ernie4_5 files keep
HF's rows, and are read as its llama files are. Tied head, head_dim 128 apart from d / heads, one
``use_bias`` for every projection (off in the released models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..convert.gguf_decoder import (add_decoder_hparams, add_key_length, add_linear_scaling, add_window,
                                    decoder_config_from_gguf, decoder_gguf_keymap, refuse_experts, standard_layer)
from ..convert.gguf_meta import T, gguf_name
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, no_window
from ..convert.hf_keys import DECODER_HF_STEPS, INTERLEAVED_QK, MLP, NORMS, VO, decoder_hf_keymap
from ..describe import describe_decoder
from ..errors import GptconvError, where
from ..layers.decoder import Decoder, DecoderConfig
from ..layers.rope import Rotary
from ..layers.norms import Norms
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

PRESETS: dict[str, Preset] = {
    # baidu/ERNIE-4.5-0.3B-PT's config.json: 18 layers of 1024, 16 heads of 128 (2 K/V), tied; 360,748,032
    # parameters, the card's "0.36B"
    "ernie-4.5-0.3b": Preset(DecoderConfig(vocab_size=103424, context_length=131072, d_model=1024, n_layers=18,
                                         n_heads=16, n_kv_heads=2, d_ff=3072, head_dim=128, norms=Norms(eps=1e-5),
                                         rope=Rotary(theta=500000.0), tie_embeddings=True, bos_token_id=1,
                                         eos_token_id=2, family="ernie4_5"), "baidu/ERNIE-4.5-0.3B-PT"),
}

# Ernie4_5Config's defaults where config.json lacks the field (a null head_dim: d / heads, as transformers)
_DEFAULTS = {"head_dim": 128, "tie_word_embeddings": True}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields({**_DEFAULTS, **data} if isinstance(data, dict) else data, origin)
    bias = f.bool("use_bias", False)  # q, k, v, the output and the MLP alike
    no_window(f)
    return decoder_config_from_hf(f, "ernie4_5", {"rms_norm_eps": 1e-5, "rope_theta": 500000.0},
                                  attention=dict(qkv_bias=bias, o_bias=bias), mlp=dict(bias=bias))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(c, "ernie4_5", "Ernie4_5ForCausalLM", biases=(c.attention.qkv_bias,) * 3, window=False)
    for name in ("attention_bias", "mlp_bias", "sliding_window"):  # not ernie4_5's fields
        del out[name]
    return {**out, "use_bias": c.attention.qkv_bias}


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    refuse_experts(f)
    for tensor in (T.ATTN_OUT, T.FFN_UP):
        if gguf_name(tensor, "bias").replace("{i}", "0") in tensors:
            raise where(f.path, "ernie4_5: llama.cpp ignores an output bias and has no MLP biases")
    return decoder_config_from_gguf(f, tensors, "ernie4_5")


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter: the generic keys and the key length (config.json always has head_dim)."""
    if c.attention.o_bias or c.mlp.bias:
        raise GptconvError("llama.cpp's ernie4_5 ignores an output bias and has no MLP biases; not exported")
    add_decoder_hparams(w, c, arch="ernie4_5")
    add_window(w, c, "ernie4_5", kept=False)
    add_key_length(w, c, always=True)
    add_linear_scaling(w, c)


def describe(c: DecoderConfig) -> list[str]:
    return [*describe_decoder(c), "interleaved RoPE (pairs x₀,x₁; x₂,x₃; …): q and k rows reordered at load "
                                  "to rotate halves, the same attention"]


FAMILY = Family(
    name="ernie4_5", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("ernie4_5",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "ernie4_5", NORMS + VO + MLP, fused=INTERLEAVED_QK, fused_first=True),
    gguf_arch="ernie4_5", config_from_gguf=config_from_gguf,
    # llama.cpp's ernie4_5 rotates pairs: its q and k rows are those of its llama files
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "ernie4_5", standard_layer(permuted=True)),
    gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe,
    # llama.cpp's converter: SentencePiece, the space prefix from tokenizer_config's add_prefix_space
    gguf_vocab={"add_prefix_space_from_config": True},
)
