"""ERNIE 4.5 dense: the decoder with interleaved RoPE (pairs x₀,x₁; x₂,x₃; …), read by reordering
HF's q and k rows into our rotate-half order (``family_battery.py`` runs the checks every family passes:
block outputs, the steps verify compares, do not depend on that order). head_dim 24 ≠ d / heads, tied."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from fixtures import make_checkpoint
from gptconv.errors import GptconvError
from gptconv.writers import export
from helpers import hf_model, hf_round_trip, random_ids

ARCH = "ernie4_5"
VOCAB = "llama-spm"  # llama.cpp's ernie4_5 converter reads SentencePiece only
SHAPE = dict(vocab_size=32000, max_position_embeddings=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, intermediate_size=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
STEPS = ["interleaved RoPE", "theta = 500000"]
# the card's 0.36B: 360,748,032 (tied)
PRESETS = {"ernie-4.5-0.3b": 360_748_032}


def test_fixture_has_the_features_it_claims(ckpt):
    c = gptconv.open_source(ckpt).config
    assert c.head_dim == 24 != c.d_model // c.n_heads and c.tie_embeddings and c.rope.theta == 500000.0
    assert not (c.attention.qkv_bias or c.attention.o_bias or c.mlp.bias)


def test_read_without_the_reordering_fails_verify(ckpt, monkeypatch):
    """A planted fault: HF's interleaved q and k rows taken as rotate-half rows."""
    from gptconv.convert.hf_keys import ATTENTION
    from gptconv.convert.keymap import Map
    from gptconv.families import ernie4_5
    plain = [Map(f"model.layers.{{i}}.{s}", f"blocks.{{i}}.{d}") for s, d in ATTENTION
             if d.startswith(("attn.q.", "attn.k."))]
    monkeypatch.setattr(ernie4_5, "INTERLEAVED_QK", plain)
    report = gptconv.verify(str(ckpt), length=32)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step


def test_use_bias_matches_transformers_and_round_trips(tmp_path):
    """use_bias: biases on q, k, v, the output and the MLP (q and k bias rows reordered as their weights);
    llama.cpp's ernie4_5 ignores the output bias, so no GGUF is written."""
    folder = make_checkpoint(tmp_path / "hf", ARCH, VOCAB, {**SHAPE, "use_bias": True})
    ours = gptconv.load(folder)
    assert ours.config.attention.qkv_bias and ours.config.attention.o_bias and ours.config.mlp.bias
    ids = random_ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        assert (ours(ids) - hf_model(folder)(ids).logits).abs().max() < 1e-4
    hf_round_trip(folder, tmp_path / "out")
    with pytest.raises(GptconvError, match="ignores an output bias"):
        export(str(folder), tmp_path / "m.gguf", "gguf", "f32")
