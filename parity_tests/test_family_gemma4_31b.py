"""Gemma 4, 31B-like (gemma4_text): global layers whose values are their keys (``attention_k_eq_v``: no v
projection; V is the k projection before k's norm and RoPE, normed with no weight) with 1 K/V head of 32 against
the local layers' 2 of 16, no per-layer embeddings, no KV sharing. ``family_battery.py`` runs the checks every
family passes, past the window."""

from __future__ import annotations

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from test_family_gemma4 import LAYERS

ARCH = "gemma4_text"
VOCAB = "llama-spm-bpe"
SHAPE = dict(vocab_size=32000, max_position_embeddings=64, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
             layer_types=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
             num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=16, final_logit_softcapping=30.0,
             hidden_size_per_layer_input=0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
STEPS = ["global layers' values are their keys (before k's norm and RoPE), 1 K/V heads", "logits soft-capped"]
PRESETS = {"gemma-4-31b": 30_697_345_340}  # the card's 30.7B
FLOAT64_BOUND = True  # transformers' own float32 is 1.8e-4 from its float64 here (ours 1.6e-4)


def test_global_layers_have_no_value_projection(ckpt):
    model = gptconv.load(ckpt)
    assert model.blocks[2].attn.v is None and model.blocks[2].attn.n_kv_heads == 1
    assert model.blocks[1].attn.v is not None and model.blocks[1].attn.n_kv_heads == 2 and model.ple is None
