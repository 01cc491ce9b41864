"""OLMo 2 and OLMo 3 (HF olmo2, olmo3; GGUF olmo2): the decoder with its norms after the sublayers,
not before (x + norm(attn(x)), then x + norm(mlp(x))), and q and k each RMS-normed over the whole
projection (all heads together) before RoPE. OLMo 3 adds sliding windows on three layers of four
(``layer_types``), and its full layers may stretch RoPE with YaRN while its sliding layers do not. llama.cpp's olmo2 rotates halves as HF does: no Q/K permutation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import Keys

from ..convert.gguf_decoder import (QK_NORM as GGUF_QK_NORM, add_decoder_hparams, add_key_length,
                                    add_yarn_scaling, decoder_config_from_gguf, decoder_gguf_keymap, refuse_experts,
                                    standard_layer)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import (decoder_config_from_hf, decoder_config_to_hf, layer_types, no_window,
                                  windows_of_layer_types)
from ..convert.hf_keys import (ATTENTION, DECODER_HF_STEPS, MLP, POST_NORMS, POST_NORM_STEPS, QK_NORM, QK_NORM_STEPS,
                               decoder_hf_keymap)
from ..describe import describe_decoder
from ..errors import where
from ..layers.decoder import FULL, Feature, Decoder, DecoderConfig, SLIDING
from .base import Family, Preset
from ..convert.gguf_meta import block_count

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

_ATTENTION, _NORMS = dict(qk_norm=True, qk_norm_over="all"), dict(place="post")  # q/k norms over the projection;
# norms after each sublayer

PRESETS: dict[str, Preset] = {
    # allenai/OLMo-2-0425-1B: 16 layers of 2048, 16 heads, untied, RoPE base 500k
    "olmo-2-1b": Preset(DecoderConfig.build(vocab_size=100352, context_length=4096, d_model=2048, n_layers=16,
                                          n_heads=16, n_kv_heads=16, d_ff=8192, norms=dict(eps=1e-6, **_NORMS),
                                          rope=dict(theta=500000.0), attention=_ATTENTION, bos_token_id=100257,
                                          eos_token_id=100257, family="olmo2"), "allenai/OLMo-2-0425-1B"),
}

_HAS = frozenset({Feature.POST_NORMS, Feature.QK_NORM_OVER_ALL, Feature.LAYER_TYPES, Feature.YARN,
                  Feature.LOCAL_ROPE})


def default_olmo3_layer_types(n: int) -> list[str]:
    """OLMo 3's default: every 4th layer sees everything, the others slide (transformers' and llama.cpp's)."""
    return [FULL if (i + 1) % 4 == 0 else SLIDING for i in range(n)]


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    bias = f.bool("attention_bias", False)
    if f.str("model_type", "olmo2") == "olmo3":
        windows = windows_of_layer_types(f, layer_types(f) or default_olmo3_layer_types(f.int("num_hidden_layers")))
    else:
        no_window(f)
        windows = {}
    return decoder_config_from_hf(f, "olmo2", {"rms_norm_eps": 1e-5}, attention=dict(qkv_bias=bias, o_bias=bias, **_ATTENTION),
                                  norms=_NORMS, **windows)


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    """olmo2, or olmo3 where some layer slides (every layer's kind written: OLMo 3's default differs)."""
    windowed = c.attention.window is not None
    out = decoder_config_to_hf(c, "olmo3" if windowed else "olmo2", "Olmo3ForCausalLM" if windowed
                               else "Olmo2ForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, False), qk_norm=True, has=_HAS)
    if c.attention.qkv_bias != c.attention.o_bias:
        raise ValueError("HF's olmo2 has biases on all of q, k, v and the output, or none")
    if windowed:  # OLMo 3 keys RoPE by layer type (its sliding layers without the full layers' YaRN)
        out["layer_types"] = [SLIDING if c.window(i) else FULL for i in range(c.n_layers)]
        local = c.rope.local_theta if c.rope.local_theta is not None else c.rope.theta
        sliding = out["rope_parameters"] if c.rope.local_theta is None else {"rope_type": "default", "rope_theta": local}
        out["rope_parameters"] = {FULL: out["rope_parameters"], SLIDING: sliding}
    elif c.rope.local_theta is not None:
        raise ValueError("HF's olmo2 has no RoPE of its own on sliding layers")
    return out


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    refuse_experts(f)
    window = f.get(Keys.Attention.SLIDING_WINDOW, int, 0) or None
    pattern = f.get(Keys.Attention.SLIDING_WINDOW_PATTERN, list, None)
    n = block_count(f, tensors)
    if window is not None and pattern is None:
        raise where(f.path, "olmo2: a sliding window without attention.sliding_window_pattern")
    if pattern is not None and (len(pattern) != n or not all(isinstance(x, bool) for x in pattern)):
        raise where(f.path, f"olmo2: attention.sliding_window_pattern must give a boolean for each of the {n} layers")
    types = tuple(SLIDING if p else FULL for p in pattern) if window is not None else ()
    # llama.cpp's olmo2 rotates sliding layers with rope.freq_base_swa and no scaling
    base = f.get(Keys.Rope.FREQ_BASE, float, 10000.0)
    local = f.get(Keys.Rope.FREQ_BASE_SWA, float, base) if window is not None else base
    scaled = f.get(Keys.Rope.SCALING_TYPE, str, "none") not in ("none", "")
    return decoder_config_from_gguf(f, tensors, "olmo2", window=window, layer_types=types,
                                    rope=dict(local_theta=local if (local != base or scaled) and window else None),
                                    attention=_ATTENTION, norms=_NORMS)


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter: the generic keys, and for OLMo 3 the window and which layers slide."""
    add_decoder_hparams(w, c, has=_HAS, arch="olmo2")
    add_key_length(w, c, always=False)
    add_yarn_scaling(w, c)
    if c.attention.window is not None:  # OLMo 3's config keys RoPE by layer type: the sliding layers' base too
        w.add_rope_freq_base_swa(c.rope.theta if c.rope.local_theta is None else c.rope.local_theta)
        w.add_sliding_window(c.attention.window)
        w.add_sliding_window_pattern([c.window(i) is not None for i in range(c.n_layers)])


FAMILY = Family(
    name="olmo2", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("olmo2", "olmo3"), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "olmo2", POST_NORMS + ATTENTION + MLP + QK_NORM),
    gguf_arch="olmo2", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "olmo2", standard_layer(permuted=False) + GGUF_QK_NORM),
    gguf_metadata=gguf_metadata,
    hf_steps={**DECODER_HF_STEPS, **POST_NORM_STEPS, **QK_NORM_STEPS}, describe=describe_decoder,
)
