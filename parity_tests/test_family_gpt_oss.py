"""gpt-oss (gpt_oss): biases on q, k, v and the output, a sink logit per head in every attention softmax,
windows (8 here; 128 in the releases) on the even layers, YaRN (not rounded out), and on every layer a router
with a bias choosing 2 of 4 experts (4 of 32 or 128) by logit, weighed by the softmax of the chosen, each a
clamped SwiGLU with biases whose gate and up columns HF interleaves. ``family_battery.py`` runs the checks
every family passes, past the window."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint

ARCH = "gpt_oss"
VOCAB = "gpt-2"
SHAPE = dict(vocab_size=50257, max_position_embeddings=128, hidden_size=128, intermediate_size=64,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
             num_experts_per_tok=2, sliding_window=8, bos_token_id=50256, eos_token_id=50256,
             pad_token_id=50256)
STEPS = ["block.0.router", "2 of 4 experts per token", "each position sees the last 8 only"]
# the cards: 21B with 3.6B active, 117B with 5.1B active
PRESETS = {"gpt-oss-20b": 20_914_757_184, "gpt-oss-120b": 116_829_156_672}


@pytest.mark.parametrize("fault", ["sinks left out", "no gate clamp", "no up clamp", "gate and up swapped",
                                   "softmax over all experts"])
def test_planted_faults_fail_verify(ckpt, monkeypatch, fault):
    """Each of gpt-oss's own steps, done another way, is caught by verify against transformers."""
    from gptconv.layers import attention, mlp
    if fault == "sinks left out":
        real = attention.causal_attention
        monkeypatch.setattr(attention, "causal_attention", lambda *a, **k: real(*a[:9]))
    elif fault == "no gate clamp":
        monkeypatch.setattr(mlp.ClampedSwiGLU, "forward", lambda self, x, tap=None: self.down(
            (self.up(x).clamp(-self.limit, self.limit) + 1) * (self.gate(x) * torch.sigmoid(self.gate(x) * self.alpha))))
    elif fault == "no up clamp":
        monkeypatch.setattr(mlp.ClampedSwiGLU, "forward", lambda self, x, tap=None: self.down(
            (self.up(x) + 1) * (self.gate(x).clamp(max=self.limit)
                                * torch.sigmoid(self.gate(x).clamp(max=self.limit) * self.alpha))))
    elif fault == "gate and up swapped":
        monkeypatch.setattr(mlp.ClampedSwiGLU, "forward", lambda self, x, tap=None: self.down(
            (self.gate(x).clamp(-self.limit, self.limit) + 1)
            * (self.up(x).clamp(max=self.limit) * torch.sigmoid(self.up(x).clamp(max=self.limit) * self.alpha))))
    else:  # the k chosen weighed by their share of the softmax over every expert, not renormalised
        monkeypatch.setattr(mlp.MoE, "normalize", False, raising=False)
        real_init = mlp.MoE.__init__

        def init(self, *a, **k):
            real_init(self, *a, **k)
            self.normalize = False
        monkeypatch.setattr(mlp.MoE, "__init__", init)
    report = gptconv.verify(str(ckpt), against="transformers", dtype="f32", length=64)
    print(f"\n{fault}: max|Δ| = {report.max_abs_diff:.3g}, first divergent step {report.first_divergent_step}")
    assert not report.passed


def test_the_experts_clamp_here(ckpt):
    """The fixture reaches both clamps: some expert's gate exceeds 7 on random ids, and some up ±7."""
    model = gptconv.load(ckpt)
    seen, ups = [], []
    hooks = [e.gate.register_forward_hook(lambda m, i, o: seen.append(float(o.max())))
             for b in model.blocks for e in b.mlp.experts]
    hooks += [e.up.register_forward_hook(lambda m, i, o: ups.append(float(o.abs().max())))
              for b in model.blocks for e in b.mlp.experts]
    with torch.no_grad():
        model(torch.randint(0, 50257, (1, 64), generator=torch.Generator().manual_seed(0)))
    for h in hooks:
        h.remove()
    assert max(seen) > 7.0 and max(ups) > 7.0
