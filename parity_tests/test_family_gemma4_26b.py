"""Gemma 4, 26B-A4B-like (gemma4_text): the 31B-like attention (``test_family_gemma4_31b.py``) and in every layer
the MoE block beside the dense GeGLU: 4 GeGLU experts of 24, 2 per token, routed from the RMS-normed input ×
a learned scale × d^-½, the chosen weights renormalised and × each expert's own scale; the dense and routed
outputs each normed, then summed. ``family_battery.py`` runs the checks every family passes, past the window."""

from __future__ import annotations

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from gptconv.layers import gemma4
from test_family_gemma4_31b import SHAPE as ATTENTION

ARCH = "gemma4_text"
VOCAB = "llama-spm-bpe"
SHAPE = dict(ATTENTION, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24)
STEPS = ["MoE block beside the dense MLP in every layer: 2 of 4 experts", "block.0.router", "block.0.moe"]
# Google's card: 25.2B in total, 3.8B active (ours: 3,822,530,590 with the embedding, 8 of 128 experts)
PRESETS = {"gemma-4-26b-a4b": 25_233_141_790}
FLOAT64_BOUND = True  # transformers' own float32 is 1.8e-4 from its float64 here (ours 1.6e-4)


def test_the_experts_scale_left_out_fails_verify(ckpt, monkeypatch):
    """A planted fault: the chosen experts' weights not multiplied by their own scales."""
    real = gemma4.Router.forward

    def unscaled(self, x, tap):
        weights, chosen = real(self, x, tap)
        return weights / self.expert_scale[chosen], chosen
    monkeypatch.setattr(gemma4.Router, "forward", unscaled)
    report = gptconv.verify(str(ckpt), length=40)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step
