"""Gemma 4, text (HF gemma4_text, and the text model of the multimodal gemma4): its own trace
(``layers/gemma4.py``): w-scaled norms, unscaled scores, wider global heads with proportional RoPE, keys as
values (31B, 26B-A4B), KV sharing and per-layer embeddings (E2B, E4B), the MoE block beside the dense MLP
(26B-A4B), a scalar per layer and soft-capped logits. Its HF layout: ``convert/gemma4.py``.

GGUF (llama.cpp's ``gemma4``): every tensor as HF stores it under llama.cpp's names, and a computed
``rope_freqs`` for the proportional RoPE (``convert/gemma4.py``).
"""

from __future__ import annotations

from ..convert.gemma4 import (GEMMA4_HF_STEPS, describe_gemma4, gemma4_config_from_gguf, gemma4_config_from_hf,
                              gemma4_config_to_hf, gemma4_gguf_keymap, gemma4_gguf_metadata, gemma4_gguf_tensors,
                              gemma4_hf_keymap)
from ..layers.gemma4 import Gemma4, Gemma4Config
from .base import Family, Wrapper

FAMILY = Family(
    name="gemma4", config_class=Gemma4Config, model_class=Gemma4, presets={},
    hf_model_types=("gemma4_text",), config_from_hf=gemma4_config_from_hf, config_to_hf=gemma4_config_to_hf,
    hf_keymap=gemma4_hf_keymap,
    gguf_arch="gemma4", config_from_gguf=gemma4_config_from_gguf, gguf_keymap=gemma4_gguf_keymap,
    gguf_metadata=gemma4_gguf_metadata, gguf_tensors=gemma4_gguf_tensors,
    # llama.cpp's converter: model gemma4 (BPE over ▁-spaced text, byte fallback), every score -1000
    gguf_vocab={"model": "gemma4"},
    hf_steps=GEMMA4_HF_STEPS, describe=describe_gemma4,
    # the E2B, E4B, 26B-A4B and 31B checkpoints hold the text model beside vision (and audio) towers
    wrappers=(Wrapper("gemma4", ("gemma4_text",), left_out=(
        "model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.",
        "vision_tower.", "embed_vision.", "audio_tower.", "embed_audio."),
        left_out_what="the vision and audio towers and their embedders"),),
)
