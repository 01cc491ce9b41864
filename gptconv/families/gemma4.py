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
from ..layers.gemma import FULL, SLIDING
from ..layers.gemma4 import Gemma4, Gemma4Config, PLEShape
from ..layers.mlp import Experts
from .base import Family, Preset, Wrapper

PRESETS: dict[str, Preset] = {
    # the sizes (hidden 1536, 35 layers 4 local : 1 global, 8 / 1 heads of 256 / 512, window 512, 256 per
    # layer per token, 20 KV-shared layers); the MLP's 6144, doubled on the shared layers, as its config.json
    # gives it (quoted in several public projects' tests)
    "gemma-4-e2b": Preset(Gemma4Config(
        vocab_size=262144, context_length=131072, d_model=1536, n_layers=35, n_heads=8, n_kv_heads=1, d_ff=6144,
        head_dim=256, global_head_dim=512, sliding_window=512,
        layer_types=tuple(FULL if (i + 1) % 5 == 0 else SLIDING for i in range(35)), kv_shared_layers=20,
        double_wide_mlp=True, ple=PLEShape(256), final_logit_softcapping=30.0, bos_token_id=2, eos_token_id=1),
        "google/gemma-4-E2B-it"),
    # the sizes of its config.json as public projects quote it (NeMo Megatron-Bridge's Gemma 4 E4B recipe, and
    # others): 42 layers 5 local : 1 global, 8 / 2 heads of 256 / 512, 18 KV-shared layers, MLPs not widened
    "gemma-4-e4b": Preset(Gemma4Config(
        vocab_size=262144, context_length=131072, d_model=2560, n_layers=42, n_heads=8, n_kv_heads=2, d_ff=10240,
        head_dim=256, global_head_dim=512, sliding_window=512,
        layer_types=tuple(FULL if (i + 1) % 6 == 0 else SLIDING for i in range(42)), kv_shared_layers=18,
        ple=PLEShape(256), final_logit_softcapping=30.0, bos_token_id=2, eos_token_id=1),
        "google/gemma-4-E4B-it"),
    # its config.json as public projects quote it: 60 layers 5 local : 1 global, 32 heads, 16 K/V heads of 256 on
    # the local layers and 4 of 512 on the global ones, whose values are their keys
    "gemma-4-31b": Preset(Gemma4Config(
        vocab_size=262144, context_length=262144, d_model=5376, n_layers=60, n_heads=32, n_kv_heads=16, d_ff=21504,
        head_dim=256, global_head_dim=512, global_kv_heads=4, sliding_window=1024,
        layer_types=tuple(FULL if (i + 1) % 6 == 0 else SLIDING for i in range(60)), k_eq_v=True,
        final_logit_softcapping=30.0, bos_token_id=2, eos_token_id=1),
        "google/gemma-4-31B-it"),
    # sizes from the metadata of llama.cpp's ggml-vocab-gemma-4.gguf (converted from the 26B-A4B); its global
    # layers' values are their keys, a quarter of their frequencies rotate (transformers' defaults for it)
    "gemma-4-26b-a4b": Preset(Gemma4Config(
        vocab_size=262144, context_length=262144, d_model=2816, n_layers=30, n_heads=16, n_kv_heads=8, d_ff=2112,
        head_dim=256, global_head_dim=512, global_kv_heads=2, sliding_window=1024,
        layer_types=tuple(FULL if (i + 1) % 6 == 0 else SLIDING for i in range(30)), k_eq_v=True,
        experts=Experts(128, 8, 704), final_logit_softcapping=30.0, bos_token_id=2, eos_token_id=1),
        "google/gemma-4-26B-A4B-it"),
}

FAMILY = Family(
    name="gemma4", config_class=Gemma4Config, model_class=Gemma4, presets=PRESETS,
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
