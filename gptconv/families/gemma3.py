"""Gemma 3, text only (HF gemma3_text; GGUF gemma3): Gemma's trace (``layers/gemma.py``) with q and k
RMS-normed per head before RoPE (as Qwen3) and no soft-capping of attention scores (transformers' Gemma 3
keeps attn_logit_softcapping and never applies it, nor does llama.cpp's gemma3: a config that sets it is
refused). Layers are local (sliding window, RoPE base 10k) or global (every position, RoPE base 1M, linear
scaling on the 4B and larger), five local to one global. Its formats are Gemma's (``convert/gemma.py``),
with GEMMA3 below.
"""

from __future__ import annotations

from functools import partial

from ..convert.gguf_decoder import NORM_PLUS_ONE  # noqa: F401 — its tests' name for it
from ..convert.gemma import (GemmaFormat, describe_gemma, gemma_config_from_gguf, gemma_config_from_hf,
                             gemma_config_to_hf, gemma_gguf_keymap, gemma_gguf_metadata, gemma_hf_keymap,
                             gemma_hf_steps)
# FULL, SLIDING: the names its tests import from here
from ..layers.gemma import FULL, SLIDING, Gemma, GemmaConfig, default_layer_types  # noqa: F401
from ..layers.rope import RopeScaling
from .base import Family, Preset, Wrapper

# The published configs (config.json of each google/gemma-3-*-pt repository; 4b: its text_config)
PRESETS: dict[str, Preset] = {
    "gemma-3-270m": Preset(GemmaConfig(
        vocab_size=262144, context_length=32768, d_model=640, n_layers=18, n_heads=4, n_kv_heads=1, d_ff=2048,
        head_dim=256, sliding_window=512, layer_types=default_layer_types(18), query_pre_attn_scalar=256.0,
        rope_theta=1_000_000.0, rope_local_theta=10_000.0, bos_token_id=2, eos_token_id=1, family="gemma3"),
        "google/gemma-3-270m"),
    "gemma-3-1b": Preset(GemmaConfig(
        vocab_size=262144, context_length=32768, d_model=1152, n_layers=26, n_heads=4, n_kv_heads=1, d_ff=6912,
        head_dim=256, sliding_window=512, layer_types=default_layer_types(26), query_pre_attn_scalar=256.0,
        rope_theta=1_000_000.0, rope_local_theta=10_000.0, bos_token_id=2, eos_token_id=1, family="gemma3"),
        "google/gemma-3-1b-pt"),
    # the 4B's repo holds the multimodal model (model_type gemma3: text and vision); the preset is its text model
    "gemma-3-4b": Preset(GemmaConfig(
        vocab_size=262208, context_length=131072, d_model=2560, n_layers=34, n_heads=8, n_kv_heads=4, d_ff=10240,
        head_dim=256, sliding_window=1024, layer_types=default_layer_types(34), query_pre_attn_scalar=256.0,
        rope_theta=1_000_000.0, rope_scaling=RopeScaling("linear", factor=8.0), rope_local_theta=10_000.0,
        bos_token_id=2, eos_token_id=1, family="gemma3"), "google/gemma-3-4b-pt"),
}


GEMMA3 = GemmaFormat(
    family="gemma3", model_type="gemma3_text", hf_class="Gemma3ForCausalLM", gguf_arch="gemma3",
    layer_pattern=6, qk_norm=True, local_rope=True, caps_scores=False, softcaps=(None, None), theta=1_000_000.0,
    llama_cpp_27b_layers=62, llama_cpp_caps=False, llama_cpp_window=None)

gemma3_config_from_hf = partial(gemma_config_from_hf, GEMMA3)
gemma3_config_to_hf = partial(gemma_config_to_hf, GEMMA3)
gemma3_config_from_gguf = partial(gemma_config_from_gguf, GEMMA3)
gemma3_gguf_metadata = partial(gemma_gguf_metadata, GEMMA3)
GEMMA3_HF, GEMMA3_GGUF = gemma_hf_keymap("gemma3_text"), gemma_gguf_keymap("gemma3")


FAMILY = Family(
    name="gemma3", config_class=GemmaConfig, model_class=Gemma, presets=PRESETS,
    hf_model_types=("gemma3_text",), config_from_hf=gemma3_config_from_hf, config_to_hf=gemma3_config_to_hf,
    hf_keymap=lambda config: GEMMA3_HF,
    gguf_arch="gemma3", config_from_gguf=gemma3_config_from_gguf, gguf_keymap=lambda config: GEMMA3_GGUF,
    gguf_metadata=gemma3_gguf_metadata,
    hf_steps=gemma_hf_steps(GEMMA3),
    describe=describe_gemma,
    # llama.cpp's converter: a SentencePiece Gemma vocabulary gets no space prefix
    gguf_vocab={"add_space_prefix_spm": False},
    # Gemma 3 4B, 12B, 27B: the text model of the multimodal checkpoint (SigLIP vision tower, projector)
    wrappers=(Wrapper("gemma3", ("gemma3_text",), left_out=("vision_tower.", "multi_modal_projector.",
                                                             "model.vision_tower.", "model.multi_modal_projector.")),),
)
