"""SmolLM3 (HF smollm3; GGUF smollm3): the decoder with NoPE layers, which RoPE does not rotate
(``no_rope_layers``: 1 rotates, 0 does not; absent, every ``no_rope_layer_interval``-th layer is NoPE), and
optional sliding windows (``use_sliding_window``: the layers ``layer_types`` says, else the NoPE layers).
llama.cpp's smollm3 rotates interleaved pairs (Q and K rows permuted, as its llama), skips RoPE on every
4th layer whatever the file says (no key holds the rule) and has no windows: a config with another NoPE
pattern, or with windows, is not exported to GGUF.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..convert.gguf_decoder import (add_decoder_hparams, add_window, decoder_config_from_gguf, decoder_gguf_keymap,
                                    refuse_experts, standard_layer)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import (decoder_config_from_hf, decoder_config_to_hf, layer_types, no_window,
                                  windows_of_layer_types)
from ..convert.hf_keys import ATTENTION, DECODER_HF_STEPS, MLP, NORMS, decoder_hf_keymap
from ..describe import describe_decoder
from ..errors import GptconvError, where
from ..layers.decoder import FULL, Feature, Decoder, DecoderConfig, SLIDING
from ..layers.rope import Rotary
from ..layers.norms import Norms
from .base import Family, Preset
from ..convert.gguf_meta import block_count

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

LLAMA_CPP_NOPE_STEP = 4  # llama.cpp's smollm3: layer i rotates unless (i + 1) % 4 == 0


def every_nth_nope(n_layers: int, interval: int) -> tuple[bool, ...]:
    """Per layer, whether RoPE rotates it: all but every ``interval``-th (transformers' default)."""
    return tuple((i + 1) % interval != 0 for i in range(n_layers))


PRESETS: dict[str, Preset] = {
    # HuggingFaceTB/SmolLM3-3B: 36 layers of 2048, 16 heads sharing 4 K/V heads, tied, every 4th layer NoPE,
    # RoPE base 5M, 64k context; the card's "3B": 3,075,098,624 counted (the Hub lists 3.08B)
    "smollm3-3b": Preset(DecoderConfig(vocab_size=128256, context_length=65536, d_model=2048, n_layers=36, n_heads=16,
                                     n_kv_heads=4, d_ff=11008, norms=Norms(eps=1e-6),
                                     rope=Rotary(theta=5000000.0, layers=every_nth_nope(36, 4)), tie_embeddings=True,
                                     bos_token_id=None, eos_token_id=128012, family="smollm3"),
                         "HuggingFaceTB/SmolLM3-3B"),
}

_HAS = frozenset({Feature.NOPE_LAYERS, Feature.LAYER_TYPES})


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    n = f.int("num_hidden_layers")
    listed = f.data.get("no_rope_layers")
    if listed is None:
        interval = f.positive("no_rope_layer_interval", 4)
        rope = every_nth_nope(n, interval)
    elif not isinstance(listed, list) or len(listed) != n or any(type(x) is not int or x not in (0, 1) for x in listed):
        raise f.error(f"no_rope_layers must give 1 (RoPE) or 0 (NoPE) for each of the {n} layers")
    else:
        rope = tuple(bool(x) for x in listed)
    if f.bool("use_sliding_window", False):  # the layers layer_types says, else the NoPE layers
        types = layer_types(f)
        if types is None:
            window = f.data.get("sliding_window") is not None
            types = [SLIDING if window and not r else FULL for r in rope]
        windows = windows_of_layer_types(f, types)
    else:
        no_window(f)
        windows = dict(window=None)
    bias = f.bool("attention_bias", False)
    return decoder_config_from_hf(f, "smollm3", {"rms_norm_eps": 1e-6, "rope_theta": 2000000.0},
                                  attention=dict(qkv_bias=bias, o_bias=bias), mlp=dict(bias=f.bool("mlp_bias", False)),
                                  rope=dict(layers=rope), **windows)


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(c, "smollm3", "SmolLM3ForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, c.mlp.bias),
                               has=_HAS)
    out["no_rope_layers"] = [int(c.rope_at(i)) for i in range(c.n_layers)]
    out["use_sliding_window"] = c.attention.window is not None
    out["layer_types"] = [SLIDING if c.window(i) else FULL for i in range(c.n_layers)]
    return out


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """What llama.cpp runs: every 4th layer NoPE, no window."""
    refuse_experts(f)
    from gguf import Keys
    n = block_count(f, tensors)
    if f.get(Keys.Attention.SLIDING_WINDOW, int, 0):
        raise where(f.path, "smollm3: llama.cpp's smollm3 has no sliding window")
    return decoder_config_from_gguf(f, tensors, "smollm3", rope=dict(layers=every_nth_nope(n, LLAMA_CPP_NOPE_STEP)))


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter (its LlamaModel): the generic keys, the vocabulary size and RoPE's dimensions;
    nothing of NoPE layers, which llama.cpp fixes at every 4th."""
    llama_cpp = every_nth_nope(c.n_layers, LLAMA_CPP_NOPE_STEP)
    if tuple(c.rope_at(i) for i in range(c.n_layers)) != llama_cpp:
        nope = [i for i in range(c.n_layers) if not c.rope_at(i)]
        raise GptconvError(f"llama.cpp's smollm3 skips RoPE on every 4th layer only; this model's NoPE layers are "
                           f"{nope or 'none'}; not exported")
    add_window(w, c, "smollm3", kept=False)
    add_decoder_hparams(w, c, vocab_size=True, rope_dims=True, has=_HAS - {Feature.LAYER_TYPES}, arch="smollm3")


FAMILY = Family(
    name="smollm3", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("smollm3",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "smollm3", NORMS + ATTENTION + MLP),
    gguf_arch="smollm3", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "smollm3", standard_layer(permuted=True)),
    gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"add_prefix_space_from_config": True},
)
