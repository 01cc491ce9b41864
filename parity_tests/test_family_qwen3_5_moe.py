"""Qwen3.5/3.6 MoE (qwen3_5_moe_text): Qwen3.5's hybrid decoder (``test_family_qwen3_5.py``) with routed experts
(4, 2 per token, always renormalised) and a shared expert on every layer, and no dense MLP at all.
``family_battery.py`` runs the checks every family passes, past two chunks of the rule's prompt form."""

from __future__ import annotations

import torch

from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint

ARCH = "qwen3_5_moe_text"
VOCAB = "qwen2"  # transformers reads a qwen3_5_moe_text folder's tokenizer as Qwen2's: llama.cpp's converter then
# recognises Qwen2's pre-tokenizer only
SHAPE = dict(vocab_size=151936, max_position_embeddings=160, hidden_size=64, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2, linear_num_key_heads=2,
             linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
             rope_theta=10000000.0, tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)
GENERATION_LENGTH = 70  # a 6-token prompt and 64 new tokens: well past a chunk
FLOAT64_BOUND = True  # the recurrent state carries rounding along 160 positions
CONVERTER_OPTIONS = ("--no-mtp",)  # transformers saves no MTP layers, which llama.cpp's converter otherwise requires
ROUNDED_IN_GGUF = {"attn.A_log": torch.exp}  # GGUF holds −exp(A_log): read back through log
STEPS = ["block.0.linear_attention", "block.3.attention_gate", "2 of 4 experts per token; a shared expert of 48"]
# Qwen3.6-35B-A3B's text model: the card's 35B (36B on the Hub, with the vision tower and the MTP layer); 3.45B
# activated (the card's "3B": 248 of 256 experts' 3 × 2048 × 512 left out in each of the 40 layers)
PRESETS = {"qwen3.6-35b-a3b": 34_660_610_688}


def test_the_preset_activates_3_45b():
    from gptconv.models import PRESETS as ALL
    c = ALL["qwen3.6-35b-a3b"]
    unused = c.n_layers * (c.experts.count - c.experts.used) * 3 * c.d_model * (c.experts.d_ff or c.d_ff)
    assert f"{(PRESETS['qwen3.6-35b-a3b'] - unused) / 1e9:.2f}" == "3.45"


def test_the_experts_saved_fused_are_read_alike(ckpt, tmp_path):
    """transformers 5's module layout (gate_up_proj, down_proj per layer), the layout of the released files."""
    from helpers import assert_fused_experts_read_alike
    assert_fused_experts_read_alike(ckpt, tmp_path / "fused")
