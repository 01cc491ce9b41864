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
