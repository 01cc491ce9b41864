"""EXAONE 4: norms after each sublayer, per-head q/k norms, three sliding layers with RoPE to one global
layer without (NoPE). llama.cpp's exaone4 runs sliding windows (and NoPE) for a 64-layer file only (the
32B); any other it runs as the 1.2B: every layer global and rotating. The battery compares llama.cpp on
the 1.2B's layout; a 64-layer checkpoint covers its hybrid path, and a 4-layer one shows the difference."""

from __future__ import annotations

import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from fixtures import make_checkpoint
from helpers import hf_model, random_ids

ARCH = "exaone4"
VOCAB = "gpt-2"
SHAPE = dict(vocab_size=50257, max_position_embeddings=48, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, sliding_window=10, sliding_window_pattern=4,
             bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
STEPS = ["block.0.q_norm", "block.0.post_attention_norm", "block.3.post_feedforward_norm", "3 of 4 layers",
         "NoPE layers (no RoPE: order only through the causal mask): 3"]
# the card: 1.07B without embeddings (1,069,676,288 + 102,400 × 2,048 tied)
PRESETS = {"exaone-4.0-1.2b": 1_279_391_488}
# the 1.2B's layout (its config lists every layer full: transformers cannot derive that without a window);
# the 64-layer test below covers windows
LLAMA_CPP_CHANGES = dict(sliding_window=None, layer_types=["full_attention"] * 4)


def test_llama_cpp_runs_the_hybrid_layout_of_a_64_layer_file(tmp_path):
    """EXAONE-4.0-32B's 64 layers (tiny): llama.cpp runs its sliding layers and NoPE global layers as
    transformers does, compared past the window."""
    from gptconv.writers import export
    folder = make_checkpoint(tmp_path / "hf", ARCH, VOCAB, {**SHAPE, "num_hidden_layers": 64, "hidden_size": 16,
                                                            "intermediate_size": 32, "num_attention_heads": 2,
                                                            "num_key_value_heads": 1})
    out = export(str(folder), tmp_path / "m.gguf", "gguf", "f32").out
    report = gptconv.verify(str(out), against="llama.cpp", length=32)
    print(f"\nexaone4 64 layers: our GGUF vs llama.cpp: max|Δ| = {report.max_abs_diff:.3e} at 32 positions")
    assert report.passed, (report.first_divergent_step, report.notes)


def test_llama_cpp_runs_a_windowed_file_of_other_depths_without_windows(ours_gguf):
    """The documented difference: 4 layers with a window, llama.cpp rotates and sees everything on every
    layer; ours (as transformers) does not, and verify says they differ."""
    report = gptconv.verify(str(ours_gguf), against="llama.cpp", length=32)
    assert not report.passed


def test_the_1_2b_layout_every_layer_global_and_rotating(tmp_path):
    """Without a window every layer sees everything and rotates (EXAONE-4.0-1.2B), as transformers."""
    folder = make_checkpoint(tmp_path / "dense", ARCH, VOCAB, {**SHAPE, "num_hidden_layers": 3, "sliding_window": None,
                                                               "layer_types": ["full_attention"] * 3})
    ours = gptconv.load(folder)
    assert ours.config.attention.window is None and all(ours.config.rope_at(i) for i in range(3))
    ids = random_ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        assert (ours(ids) - hf_model(folder)(ids).logits).abs().max() < 1e-4


def test_the_global_layers_rotated_anyway_fail_verify(ckpt, monkeypatch):
    """A planted fault: RoPE on the global layers too. verify finds it at the first global layer."""
    from gptconv.layers.rope import Rotary
    monkeypatch.setattr(Rotary, "at", lambda self, layer: True)
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step.startswith("block.3"), report.first_divergent_step
