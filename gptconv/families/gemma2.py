"""Gemma 2 (HF gemma2; GGUF gemma2): Gemma's trace (``layers/gemma.py``) without q/k norms, with the
attention scores and the final logits soft-capped (c · tanh(x / c); 50 and 30 in the released models),
local (sliding window) and global layers alternating (even layers local, odd global) and one RoPE base
for both kinds. Its formats are Gemma's (``convert/gemma.py``), with GEMMA2 below.

llama.cpp's gemma2 caps both always (50 and 30 where the file has no key), makes every 2nd layer global,
and its converter writes no RoPE base (llama.cpp's 10k): ours writes one only where it is not 10k.
"""

from __future__ import annotations

from functools import partial

from ..convert.gemma import (GemmaFormat, describe_gemma, gemma_config_from_gguf, gemma_config_from_hf,
                             gemma_config_to_hf, gemma_gguf_keymap, gemma_gguf_metadata, gemma_hf_keymap,
                             gemma_hf_steps)
from ..layers.gemma import Gemma, GemmaConfig, default_layer_types
from .base import Family, Preset

GEMMA2 = GemmaFormat(
    family="gemma2", model_type="gemma2", hf_class="Gemma2ForCausalLM", gguf_arch="gemma2",
    layer_pattern=2, qk_norm=False, local_rope=False, caps_scores=True, softcaps=(50.0, 30.0), theta=10_000.0,
    llama_cpp_27b_layers=46, llama_cpp_caps=True, llama_cpp_window=4096)

PRESETS: dict[str, Preset] = {
    # google/gemma-2-2b's config.json: 26 layers of 2304, 8 heads of 256 (4 K/V), window 4096, caps 50 / 30;
    # 2,614,341,888 parameters (the safetensors total on its model page)
    "gemma-2-2b": Preset(GemmaConfig(
        vocab_size=256000, context_length=8192, d_model=2304, n_layers=26, n_heads=8, n_kv_heads=4, d_ff=9216,
        head_dim=256, sliding_window=4096, layer_types=default_layer_types(26, 2), query_pre_attn_scalar=256.0,
        rope_theta=10_000.0, rope_local_theta=10_000.0, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
        qk_norm=False, bos_token_id=2, eos_token_id=1, family="gemma2"), "google/gemma-2-2b"),
}

FAMILY = Family(
    name="gemma2", config_class=GemmaConfig, model_class=Gemma, presets=PRESETS,
    hf_model_types=("gemma2",), config_from_hf=partial(gemma_config_from_hf, GEMMA2),
    config_to_hf=partial(gemma_config_to_hf, GEMMA2), hf_keymap=lambda config: gemma_hf_keymap("gemma2"),
    gguf_arch="gemma2", config_from_gguf=partial(gemma_config_from_gguf, GEMMA2),
    gguf_keymap=lambda config: gemma_gguf_keymap("gemma2"), gguf_metadata=partial(gemma_gguf_metadata, GEMMA2),
    hf_steps=gemma_hf_steps(GEMMA2), describe=describe_gemma,
    # llama.cpp's converter: SentencePiece only, no space prefix
    gguf_vocab={"add_space_prefix_spm": False},
)
