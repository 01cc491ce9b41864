"""OLMo 2 / OLMo 3: norms after each sublayer, q/k norms over the whole projection, OLMo 3's sliding
windows on three layers of four (``family_battery.py`` runs the checks every family passes)."""

from __future__ import annotations

import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from helpers import hf_model, random_ids

ARCH = "olmo3"  # OLMo 2 with sliding windows: every feature of the family
VOCAB = "gpt-2"
SHAPE = dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, sliding_window=12,
             # OLMo 3's RoPE: YaRN on the full layers (factor 8 from 8192 in Olmo-3-7B; 4 from 16 here), none on
             # the sliding layers
             rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                                 "beta_slow": 1.0, "attention_factor": 1.1386294361119891},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}},
             bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
STEPS = ["block.0.q_norm", "block.0.k_norm", "block.0.post_attention_norm", "block.3.post_feedforward_norm",
         "norms after each sublayer", "3 of 4 layers", "yarn scaling", "sliding layers: theta = 500000 unscaled"]
PRESETS = {"olmo-2-1b": 1_484_916_736}


def test_olmo2_without_windows_matches_transformers(tmp_path):
    from fixtures import make_checkpoint
    folder = make_checkpoint(tmp_path / "olmo2", "olmo2", VOCAB,
                             {**{k: v for k, v in SHAPE.items() if k not in ("sliding_window", "rope_parameters")},
                              "rope_theta": 500000.0})
    ours = gptconv.load(folder)
    assert ours.config.attention.window is None and ours.config.norms.place == "post"
    ids = random_ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        assert (ours(ids) - hf_model(folder)(ids).logits).abs().max() < 1e-4


def test_the_window_is_where_layer_types_say(ckpt):
    c = gptconv.open_source(ckpt).config
    assert [c.window(i) for i in range(4)] == [12, 12, 12, None]
    assert c.rope.scaling.kind == "yarn" and c.rope.local_theta == 500000.0


def test_yarn_on_the_sliding_layers_too_fails_verify(ckpt, monkeypatch):
    """A planted fault: the full layers' YaRN applied to the sliding layers as well (one RoPE for all)."""
    from gptconv.layers.rope import Rotary
    plant_part(monkeypatch, Rotary, local_theta=None)  # noqa: F405
    report = gptconv.verify(str(ckpt), length=32)
    assert not report.passed and report.first_divergent_step.startswith("block.0."), report.first_divergent_step
