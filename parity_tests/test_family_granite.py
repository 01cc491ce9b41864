"""Granite 3.x: the decoder with µP multipliers (the embedding ×, each sublayer's output × before
the residual add, the attention scale in place of head_dim^-½, the logits ÷), at values like the
released models' (``family_battery.py`` runs the checks every family passes)."""

from __future__ import annotations

import pytest

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint

ARCH = "granite"
VOCAB = "gpt-2"
SHAPE = dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True, rope_theta=10000000.0,
             embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0,
             bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
STEPS = ["token_embedding × 12", "each sublayer's output × 0.22", "attention scores × 0.0078125", "logits ÷ 8"]
# the card: 2.5B (ibm-granite/granite-3.3-2b-base: 2,533,539,840 with its tied embedding)
PRESETS = {"granite-3.3-2b": 2_533_539_840}


def test_the_multipliers_are_read(ckpt):
    c = gptconv.open_source(ckpt).config
    m = c.multipliers
    assert (m.embedding, m.residual, m.attention, m.logits) == (12.0, 0.22, 0.0078125, 8.0)


@pytest.mark.parametrize("field, step", [("embedding", "block.0"), ("residual", "block.0"), ("attention", "block.0"),
                                         ("logits", "logits")])
def test_each_multiplier_dropped_fails_verify_where_it_acts(ckpt, monkeypatch, field, step):
    """A planted fault: one multiplier left at Llama's value (1, or head_dim^-½ for the attention). The
    token_embedding step is the lookup (HF's embed_tokens): a dropped embedding multiplier shows in block 0."""
    from gptconv.layers.multipliers import Multipliers
    plant_part(monkeypatch, Multipliers, **{field: None if field == "attention" else 1.0})  # noqa: F405
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step.startswith(step), report.first_divergent_step
