"""Gemma 4, text (HF gemma4_text, and the text model of the multimodal gemma4): its own trace
(``layers/gemma4.py``): w-scaled norms, unscaled scores, wider global heads with proportional RoPE, keys as
values (31B, 26B-A4B), KV sharing and per-layer embeddings (E2B, E4B), the MoE block beside the dense MLP
(26B-A4B), a scalar per layer and soft-capped logits. Its HF layout: ``convert/gemma4.py``.

GGUF (llama.cpp's ``gemma4``) is not written or read yet: export and import refuse it in one line.
"""

from __future__ import annotations

from typing import Any

from ..convert.gemma4 import (GEMMA4_HF_STEPS, describe_gemma4, gemma4_config_from_hf, gemma4_config_to_hf,
                              gemma4_hf_keymap)
from ..errors import GptconvError, where
from ..layers.gemma4 import Gemma4, Gemma4Config
from .base import Family, Wrapper

_NO_GGUF = "llama.cpp's gemma4 GGUF is not supported yet (Gemma 4 loads and exports as HF safetensors)"


def _config_from_gguf(f: Any, tensors: dict) -> Gemma4Config:
    raise where(f.path, _NO_GGUF)


def _gguf_keymap(c: Gemma4Config):
    raise GptconvError(_NO_GGUF)


FAMILY = Family(
    name="gemma4", config_class=Gemma4Config, model_class=Gemma4, presets={},
    hf_model_types=("gemma4_text",), config_from_hf=gemma4_config_from_hf, config_to_hf=gemma4_config_to_hf,
    hf_keymap=gemma4_hf_keymap,
    gguf_arch="gemma4", config_from_gguf=_config_from_gguf, gguf_keymap=_gguf_keymap,
    gguf_metadata=lambda w, c: _gguf_keymap(c),
    hf_steps=GEMMA4_HF_STEPS, describe=describe_gemma4,
    # the E2B, E4B, 26B-A4B and 31B checkpoints hold the text model beside vision (and audio) towers
    wrappers=(Wrapper("gemma4", ("gemma4_text",), left_out=(
        "model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.",
        "vision_tower.", "embed_vision.", "audio_tower.", "embed_audio."),
        left_out_what="the vision and audio towers and their embedders"),),
)
