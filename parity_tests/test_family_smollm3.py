"""SmolLM3: NoPE layers (every 4th here, as in SmolLM3-3B: layer 3 of 4) in the decoder, with llama.cpp's
smollm3 (Q/K rows permuted; every 4th layer NoPE, fixed in llama.cpp); ``family_battery.py`` runs the checks
every family passes. SmolLM3's windows (``use_sliding_window``) are off in its releases and absent from
llama.cpp's smollm3: a test below runs them against transformers and shows their GGUF export refused, as is
any other NoPE pattern than llama.cpp's."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from fixtures import make_checkpoint
from gptconv.errors import GptconvError
from gptconv.writers import export
from helpers import hf_model, random_ids

ARCH = "smollm3"
VOCAB = "gpt-2"  # SmolLM3's own is Llama 3's (128,256 tokens): llama.cpp's converter reads either as BPE
SHAPE = dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, no_rope_layer_interval=4, rope_theta=5000000.0,
             tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
STEPS = ["NoPE layers (no RoPE: order only through the causal mask): 3"]
# SmolLM3-3B: 3,075,098,624 counted on meta (the card: "3B"; the Hub: 3.08B)
PRESETS = {"smollm3-3b": 3_075_098_624}


def test_the_nope_layers_are_every_4th(ckpt):
    c = gptconv.open_source(ckpt).config
    assert [c.rope_at(i) for i in range(4)] == [True, True, True, False] and c.attention.window is None


def test_an_irregular_no_rope_layers_list_matches_transformers_and_is_not_exported_to_gguf(tmp_path):
    """An explicit no_rope_layers (layers 0 and 2 NoPE): as transformers; llama.cpp would rotate them."""
    folder = make_checkpoint(tmp_path / "hf", ARCH, VOCAB, {**SHAPE, "no_rope_layers": [0, 1, 0, 1]})
    ours = gptconv.load(folder)
    assert [ours.config.rope_at(i) for i in range(4)] == [False, True, False, True]
    ids = random_ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        assert (ours(ids) - hf_model(folder)(ids).logits).abs().max() < 1e-4
    with pytest.raises(GptconvError, match="llama.cpp's smollm3 skips RoPE on every 4th layer only; this model's "
                                           r"NoPE layers are \[0, 2\]; not exported"):
        export(str(folder), tmp_path / "m.gguf", "gguf", "f32")


def test_sliding_windows_on_the_nope_layers_match_transformers_and_are_not_exported_to_gguf(tmp_path):
    """use_sliding_window without layer_types: transformers slides the NoPE layers (here layer 3, window 8)."""
    folder = make_checkpoint(tmp_path / "hf", ARCH, VOCAB, {**SHAPE, "use_sliding_window": True, "sliding_window": 8})
    ours = gptconv.load(folder)
    assert [ours.config.window(i) for i in range(4)] == [None, None, None, 8]
    ids = random_ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        assert (ours(ids) - hf_model(folder)(ids).logits).abs().max() < 1e-4
    with pytest.raises(GptconvError, match="llama.cpp's smollm3 has no sliding window"):
        export(str(folder), tmp_path / "m.gguf", "gguf", "f32")


def test_the_nope_layer_rotated_anyway_fails_verify(ckpt, monkeypatch):
    """A planted fault: RoPE on the NoPE layer too. verify finds it at that layer (block 3)."""
    from gptconv.layers.rope import Rotary
    monkeypatch.setattr(Rotary, "at", lambda self, layer: True)
    report = gptconv.verify(str(ckpt), length=32)
    assert not report.passed and report.first_divergent_step.startswith("block.3"), report.first_divergent_step
