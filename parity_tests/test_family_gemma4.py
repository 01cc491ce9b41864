"""Gemma 4, E2B-like (gemma4_text): per-layer embeddings (8 per layer), the last 2 of 6 layers sharing the keys
and values of earlier ones with double-wide MLPs, local layers (heads of 16, window 16) and global ones (heads of
32 with proportional RoPE on a quarter of their frequencies), w-scaled norms, a scalar per layer, soft-capped
logits. ``family_battery.py`` runs the checks every family passes, past the window. The 31B-like (keys as
values) and 26B-A4B-like (the MoE block) checkpoints: ``test_family_gemma4_31b.py``, ``…_26b.py``."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from gptconv.layers import gemma4
from gptconv.layers.kv_cache import KVCache, SharedKV

ARCH = "gemma4_text"
VOCAB = "gpt-2"
LAYERS = ["sliding_attention", "sliding_attention", "full_attention"] * 2
SHAPE = dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
             layer_types=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
             sliding_window=16, final_logit_softcapping=30.0, hidden_size_per_layer_input=8,
             vocab_size_per_layer_input=50257, num_kv_shared_layers=2, use_double_wide_mlp=True,
             bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
STEPS = ["per_layer_embedding", "block.0.per_layer_input", "KV sharing: the last 2 layers", "4←3, 5←2",
         "8 of them rotated: proportional RoPE"]
PRESETS = {}


def test_shared_layers_hold_no_keys_and_refer_to_their_source(ckpt):
    """Layers 4 (local) and 5 (global) attend to layers 3's and 2's keys and values: no k or v of their own, a
    cache slot that stores nothing and refers to the source's, an MLP twice as wide."""
    model = gptconv.load(ckpt)
    c = model.config
    assert [c.kv_source(i) for i in range(6)] == [None, None, None, None, 3, 2]
    assert model.blocks[4].attn.k is None and model.blocks[5].attn.v is None and model.blocks[3].attn.k is not None
    assert model.blocks[4].mlp.gate.out_features == 2 * model.blocks[3].mlp.gate.out_features
    cache = KVCache.for_model(model, batch=1, max_len=64)
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7, 8]]), cache=cache)
    assert isinstance(cache.layers[5], SharedKV) and cache.layers[5].of is cache.layers[2]
    assert cache.layers[4].nbytes == 0 and cache.layers[3].nbytes > 0


@pytest.mark.parametrize("fault", ["partial rotary", "scalar left out", "no value norm"])
def test_planted_faults_fail_verify(ckpt, monkeypatch, fault):
    """Each of Gemma 4's own steps, done another way, is caught: global RoPE over the first quarter of each
    head's dimensions (NeoX partial rotary) instead of a quarter of its frequencies; the layer scalar left out;
    V not normed."""
    if fault == "partial rotary":
        real = gemma4.Gemma4.inv_freq

        def inv_freq(self, kind, device):
            freqs = real(self, kind, device)
            if kind == "full_attention":  # the rotated quarter's own frequencies, over a quarter of the head
                c = self.config
                r = int(c.global_rope_fraction * c.global_head_dim // 2)
                freqs = torch.cat([gemma4.rope_frequencies(2 * r, c.rope_theta), torch.zeros(freqs.numel() - r)])
            return freqs
        monkeypatch.setattr(gemma4.Gemma4, "inv_freq", inv_freq)
    elif fault == "scalar left out":
        real_forward = gemma4.Block.forward
        monkeypatch.setattr(gemma4.Block, "forward", lambda self, x, step, shared, per_layer: real_forward(
            self, x, step, shared, per_layer) / self.layer_scalar)
    else:
        monkeypatch.setattr(gemma4, "plain_rms_norm", lambda x, eps: x)
    report = gptconv.verify(str(ckpt), length=40)
    assert not report.passed, fault
