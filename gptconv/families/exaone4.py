"""EXAONE 4.0 (HF exaone4; GGUF exaone4): the decoder with its norms after the sublayers (as OLMo 2),
q and k RMS-normed per head (as Qwen3), and, where the config has a window, three sliding layers with
RoPE to one global layer without it (NoPE: position enters the global layers only through the causal
mask). Without a window (EXAONE-4.0-1.2B) every layer is global and rotates. llama.cpp's exaone4 rotates
halves as HF does: no Q/K permutation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import Keys

from ..convert.gguf_decoder import (QK_NORM as GGUF_QK_NORM, add_decoder_hparams, add_key_length,
                                    decoder_config_from_gguf, decoder_gguf_keymap, refuse_experts, standard_layer)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, layer_types, windows_of_layer_types
from ..convert.hf_keys import (ATTENTION, DECODER_HF_STEPS, MLP, POST_NORMS, POST_NORM_STEPS, QK_NORM, QK_NORM_STEPS,
                               decoder_hf_keymap)
from ..describe import describe_decoder
from ..errors import GptconvError, where
from ..layers.decoder import FULL, Feature, Decoder, DecoderConfig, SLIDING
from ..layers.rope import RopeScaling
from .base import Family, Preset
from ..convert.gguf_meta import block_count

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

_ATTENTION, _NORMS = dict(qk_norm=True), dict(place="post")  # q/k norms; norms after each sublayer

PRESETS: dict[str, Preset] = {
    # LGAI-EXAONE/EXAONE-4.0-1.2B: 30 layers of 2048, 32 heads, 8 K/V heads of 64, tied, every layer global;
    # Llama 3 RoPE scaling (factor 16 from 8192) for its 64k context
    "exaone-4.0-1.2b": Preset(DecoderConfig.build(
        vocab_size=102400, context_length=65536, d_model=2048, n_layers=30, n_heads=32, n_kv_heads=8, d_ff=4096,
        head_dim=64, norms=dict(eps=1e-5, **_NORMS), attention=_ATTENTION, tie_embeddings=True,
        rope=dict(theta=1000000.0, scaling=RopeScaling("llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                       original_context_length=8192)),
        bos_token_id=1, eos_token_id=361, family="exaone4"), "LGAI-EXAONE/EXAONE-4.0-1.2B"),
}

_HAS = frozenset({Feature.POST_NORMS, Feature.LAYER_TYPES, Feature.NOPE_LAYERS})


def _layer_types(f: ConfigFields) -> list[str] | None:
    """``layer_types``, else ``sliding_window_pattern`` (an int n: every n-th layer global; or a string like
    "LLLG" repeated over the layers), as transformers and llama.cpp's converter read them; None: no window."""
    if f.data.get("sliding_window") is None:
        return None
    types = layer_types(f)
    if types is not None:
        return types
    n, pattern = f.int("num_hidden_layers"), f.data.get("sliding_window_pattern", 4)
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        return [SLIDING if pattern[i % len(pattern)] == "L" else FULL for i in range(n)]
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise f.error(f"field 'sliding_window_pattern' is {pattern!r}: an integer ≥ 1 or a string of L and G")
    return [SLIDING if (i + 1) % pattern else FULL for i in range(n)]


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    types = _layer_types(f)
    windows = windows_of_layer_types(f, types)
    # with a window, only the sliding layers rotate; without one, every layer does
    rope_layers = tuple(t == SLIDING for t in types) if types else ()
    return decoder_config_from_hf(f, "exaone4", {"rms_norm_eps": 1e-5}, rope=dict(layers=rope_layers), **windows,
                                  attention=_ATTENTION, norms=_NORMS)


def _nope_on_global_layers(c: DecoderConfig) -> None:
    """EXAONE 4 has no NoPE rule of its own: its global layers skip RoPE exactly when some layer slides."""
    expected = tuple(c.window(i) is not None for i in range(c.n_layers)) if c.attention.window is not None else ()
    if tuple(c.rope_at(i) for i in range(c.n_layers)) != (expected or (True,) * c.n_layers):
        raise ValueError("EXAONE 4 rotates exactly its sliding layers (all of them without a window); "
                         "this model's NoPE layers differ")


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    _nope_on_global_layers(c)
    out = decoder_config_to_hf(c, "exaone4", "Exaone4ForCausalLM", qk_norm=True, has=_HAS)
    if c.attention.window is not None:
        out["layer_types"] = [SLIDING if c.window(i) else FULL for i in range(c.n_layers)]
    return out


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    refuse_experts(f)
    window = f.get(Keys.Attention.SLIDING_WINDOW, int, 0) or None
    n = block_count(f, tensors)
    types: tuple[str, ...] = ()
    if window is not None:
        # llama.cpp's default where the file says no pattern: every 4th layer global
        pattern = f.get(Keys.Attention.SLIDING_WINDOW_PATTERN, list, [(i + 1) % 4 != 0 for i in range(n)])
        if len(pattern) != n or not all(isinstance(x, bool) for x in pattern):
            raise where(f.path, f"exaone4: attention.sliding_window_pattern must give a boolean for each of the "
                                f"{n} layers")
        types = tuple(SLIDING if p else FULL for p in pattern)
    rope_layers = tuple(t == SLIDING for t in types)
    return decoder_config_from_gguf(f, tensors, "exaone4", window=window, layer_types=types,
                                    rope=dict(layers=rope_layers), attention=_ATTENTION,
                                    norms=_NORMS)


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter: the generic keys, the vocabulary size, the window and which layers slide."""
    try:
        _nope_on_global_layers(c)
    except ValueError as e:
        raise GptconvError(f"cannot be written as GGUF exaone4: {e}") from None
    add_decoder_hparams(w, c, vocab_size=True, has=_HAS, arch="exaone4")
    add_key_length(w, c, always=False)
    if c.attention.window is not None:
        w.add_sliding_window(c.attention.window)
        w.add_sliding_window_pattern([c.window(i) is not None for i in range(c.n_layers)])


FAMILY = Family(
    name="exaone4", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("exaone4",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: decoder_hf_keymap(c, "exaone4", POST_NORMS + ATTENTION + MLP + QK_NORM),
    gguf_arch="exaone4", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "exaone4", standard_layer(permuted=False) + GGUF_QK_NORM),
    gguf_metadata=gguf_metadata,
    hf_steps={**DECODER_HF_STEPS, **POST_NORM_STEPS, **QK_NORM_STEPS}, describe=describe_decoder,
)
