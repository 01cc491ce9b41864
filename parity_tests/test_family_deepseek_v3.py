"""DeepSeek-V3 (deepseek_v3): multi-head latent attention (q through a low-rank step, keys and values from a
32-wide latent, a 16-dim rotated part shared by the heads, the releases' interleaved rows), YaRN ×4 from 32 with
DeepSeek's mscale on the attention scale, one dense layer then experts routed DeepSeek's way (sigmoid scores, a
bias on the choice, 2 of 4 groups, 2 of 8 experts, × 2.5) beside an ungated shared expert. ``family_battery.py``
runs the checks every family passes."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint

ARCH = "deepseek_v3"
VOCAB = "gpt-2"
SHAPE = dict(vocab_size=50257, max_position_embeddings=128, hidden_size=64, intermediate_size=96,
             moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
             n_shared_experts=1, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
             first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=24,
             v_head_dim=20, routed_scaling_factor=2.5,
             rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                              "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                              "rope_theta": 10000.0},
             scoring_func="sigmoid", topk_method="noaux_tc", bos_token_id=50256, eos_token_id=50256,
             pad_token_id=50256)
STEPS = ["block.0.latent", "block.1.router"]
# the cards: DeepSeek-V3 671B (37B activated; 685B with its MTP layer, not counted here), Kimi K2 1T (32B)
PRESETS = {"deepseek-v3": 671_026_419_200, "kimi-k2": 1_026_408_232_448}


@pytest.mark.parametrize("fault", ["rotated rows left interleaved", "choice bias left out", "groups left out",
                                   "routed scaling left out", "mscale left out"])
def test_planted_faults_fail_verify(ckpt, monkeypatch, fault):
    """Each of DeepSeek's own steps, done another way, is caught by verify against transformers."""
    from dataclasses import replace
    from gptconv.families import deepseek_v3
    from gptconv.layers import mlp
    if fault == "rotated rows left interleaved":
        monkeypatch.setattr(deepseek_v3, "_rope_rows", lambda t, groups, rope, to_halves: t)
    elif fault == "choice bias left out":
        real = mlp.MoE.route

        def route(self, logits):
            kept, self.correction = self.correction, None
            try:
                return real(self, logits)
            finally:
                self.correction = kept
        monkeypatch.setattr(mlp.MoE, "route", route)
    elif fault == "groups left out":
        plant(monkeypatch, expert_groups=(1, 1))
    elif fault == "routed scaling left out":
        plant(monkeypatch, routed_scaling=1.0)
    else:
        from gptconv.layers.decoder import LlamaConfig
        real = LlamaConfig.__post_init__

        def planted(self):
            real(self)
            if self.mla is not None:
                object.__setattr__(self, "mla", replace(self.mla, scale=self.mla.qk_head_dim ** -0.5))
        monkeypatch.setattr(LlamaConfig, "__post_init__", planted)
    report = gptconv.verify(str(ckpt), against="transformers", dtype="f32", length=64)
    print(f"\n{fault}: max|Δ| = {report.max_abs_diff:.3g}, first divergent step {report.first_divergent_step}")
    assert not report.passed


def test_the_cache_holds_the_latent_not_the_heads(ckpt):
    """Per position and layer the cache holds the latent and the shared rotated key part (32 + 16 values), where
    a full cache holds every head's key and value (4 × (40 + 20)): 5× less here, 71× at DeepSeek-V3's sizes
    (576 against 128 × 320). Generation through it equals recompute (the battery's test)."""
    from gptconv.layers.kv_cache import KVCache
    from gptconv.models import PRESETS as ALL
    model = gptconv.load(ckpt)
    cache = KVCache.for_model(model, batch=1, max_len=64)
    m = model.config.mla
    assert cache.nbytes == 3 * 64 * (m.kv_lora_rank + m.qk_rope_dim) * 4
    full = lambda c: c.n_heads * (c.mla.qk_head_dim + c.mla.v_head_dim)  # noqa: E731 - per position and layer
    assert full(model.config) / (m.kv_lora_rank + m.qk_rope_dim) == 5.0
    v3 = ALL["deepseek-v3"]
    assert (v3.mla.kv_lora_rank + v3.mla.qk_rope_dim, full(v3)) == (576, 40960)
