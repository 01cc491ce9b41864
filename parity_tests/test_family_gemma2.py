"""Gemma 2: Gemma's trace without q/k norms, attention scores and logits soft-capped, local and global
layers alternating with one RoPE base (``family_battery.py`` runs the checks every family passes). The
caps are small (5 and 3, against 50 and 30 released) so that capping moves the scores and logits of this
random-init checkpoint; the window (12) is passed three times over."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from fixtures import make_gemma3
from gptconv.errors import GptconvError
from gptconv.layers.gemma import FULL, SLIDING
from helpers import hf_model, random_ids

ARCH = "gemma2"
VOCAB = "llama-spm"  # llama.cpp's gemma2 converter reads SentencePiece only; llama.cpp ships no Gemma vocabulary
SHAPE = dict(vocab_size=32000, max_position_embeddings=48, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, intermediate_size=128, sliding_window=12,
             # llama.cpp stores no query_pre_attn_scalar and assumes head_dim (the 2B's and 9B's 256)
             query_pre_attn_scalar=16, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
STEPS = ["block.0.post_attention_norm", "block.3.post_feedforward_norm", "2 local layers see their last 12",
         "attention scores soft-capped: c · tanh(x / c), c = 5", "logits soft-capped: c · tanh(x / c), c = 3"]
PRESETS = {"gemma-2-2b": 2_614_341_888}


def test_fixture_has_the_features_it_claims(ckpt):
    c = gptconv.open_source(ckpt).config
    # transformers' default layer_types (none in config.json): even layers local, odd global, as llama.cpp's
    assert c.layer_types == (SLIDING, FULL, SLIDING, FULL) and c.sliding_window == 12 and c.context_length >= 36
    assert (c.attn_logit_softcapping, c.final_logit_softcapping, c.qk_norm) == (5.0, 3.0, False)
    assert c.rope_local_theta == c.rope_theta == 10_000.0 and c.rope_scaling is None


def test_gemma2_without_attention_softcapping_fails_verify(ckpt, monkeypatch):
    """A planted fault: the scores left uncapped (the logits still capped)."""
    from gptconv.layers.gemma import GemmaConfig
    real = GemmaConfig.__post_init__

    def uncapped(self):
        real(self)
        object.__setattr__(self, "attn_logit_softcapping", None)
    monkeypatch.setattr(GemmaConfig, "__post_init__", uncapped)
    report = gptconv.verify(str(ckpt), length=32)
    assert not report.passed and report.first_divergent_step.startswith("block.0."), report.first_divergent_step


def test_gguf_export_refuses_what_llama_cpps_gemma2_would_not_run(ckpt, tmp_path):
    """llama.cpp's gemma2 caps always and makes every 2nd layer global: a model without a cap, or with
    other layer kinds, is refused, never written to run otherwise."""
    import dataclasses
    from gptconv.convert.gemma import gemma_gguf_metadata
    from gptconv.families.gemma2 import GEMMA2
    c = gptconv.open_source(ckpt).config
    for change in (dict(final_logit_softcapping=None), dict(attn_logit_softcapping=None),
                   dict(layer_types=(SLIDING,) * 3 + (FULL,))):
        with pytest.raises(GptconvError, match="cannot be written as GGUF gemma2"):
            gemma_gguf_metadata(GEMMA2, None, dataclasses.replace(c, **change))


def test_transformers_gemma3_ignores_attention_softcapping_so_we_refuse_it(tmp_path):
    """transformers' Gemma 3 keeps attn_logit_softcapping but never passes it to its attention (nor does
    llama.cpp's gemma3 cap scores): its logits are the same with it set; we refuse the field, never
    reading it as a cap no reference applies."""
    capped, plain = make_gemma3(tmp_path / "capped", attn_logit_softcapping=5.0), make_gemma3(tmp_path / "plain")
    ids = random_ids(400, 48)
    with torch.no_grad():
        assert hf_model(capped)(ids).logits.equal(hf_model(plain)(ids).logits)
    with pytest.raises(GptconvError, match="attn_logit_softcapping"):
        gptconv.load(capped)
