"""Qwen3.5 dense (qwen3_5_text): three linear-attention layers (a gated delta rule: 2 key heads, 4 value heads,
so the value heads share keys; value heads as wide as key heads, as llama.cpp needs: ``test_linear_attention.py``
compares wider ones with transformers) and one gated full-attention layer with partial rotary (8 of 32) and q/k
norms, every RMSNorm scaling by 1 + w. ``family_battery.py`` runs the checks every family passes; the
checkpoint's context (160) is past two chunks (64) of the rule's prompt form."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from family_battery import plant
from gptconv.convert.keymap import model_shapes
from gptconv.layers import linear_attention
from gptconv.models import build_empty
from helpers import run_cli

ARCH = "qwen3_5_text"
VOCAB = "gpt-2"  # Qwen3.5's own has 248,320 tokens; llama.cpp's converter reads GPT-2's as BPE
SHAPE = dict(vocab_size=50257, max_position_embeddings=160, hidden_size=64, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=96,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
             linear_conv_kernel_dim=4, rope_theta=10000000.0, tie_word_embeddings=True, bos_token_id=50256,
             eos_token_id=50256)
GENERATION_LENGTH = 70  # a 6-token prompt and 64 new tokens: well past a chunk
FLOAT64_BOUND = True  # the recurrent state carries rounding along 160 positions
CONVERTER_OPTIONS = ("--no-mtp",)  # transformers saves no MTP layers, which llama.cpp's converter otherwise requires
ROUNDED_IN_GGUF = {"attn.A_log": torch.exp}  # GGUF holds −exp(A_log): read back through log
STEPS = ["block.0.linear_attention", "block.0.gated_norm", "block.3.attention_gate",
         "linear attention (a gated delta rule, no position signal but order) in 3 layers (0, 1, 2)",
         "mixing positions: attention in layers 3"]
# Qwen3.5-0.8B's text model (the card's 0.8B counts its vision tower too)
PRESETS = {"qwen3.5-0.8b": 752_393_024}


def test_three_of_four_layers_are_linear_attention(ckpt):
    c = gptconv.open_source(ckpt).config
    assert [c.linear_at(i) for i in range(4)] == [True, True, True, False]
    assert c.rope_dim == 8 and c.attention_gate and c.offset_norms and c.linear_attention.v_heads == 4


def test_mrope_reduces_to_plain_rope_for_text(ckpt):
    """Qwen3.5's interleaved M-RoPE gives the t, h and w streams sections of the frequencies; for text the
    three streams are the token's position, so its cos and sin are plain RoPE's on the rotated dims."""
    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    from gptconv.layers.rope import rope_angles
    rotary = Qwen3_5TextRotaryEmbedding(AutoConfig.from_pretrained(ckpt))
    assert rotary.mrope_section == [11, 11, 10]  # transformers' default: text positions fill every section alike
    positions = torch.arange(100)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None])
    model = gptconv.load(ckpt)
    ours = rope_angles(model.inv_freq(torch.device("cpu")), 0, 100, torch.float32, None)
    assert torch.equal(cos[0], ours[0]) and torch.equal(sin[0], ours[1])


def test_the_state_forgetting_nothing_fails_verify_at_the_first_layer(ckpt, monkeypatch):
    """A planted fault: the decay left out (g = 0: the state never forgets). verify finds it in block 0."""
    real = linear_attention.chunked_delta_rule
    monkeypatch.setattr(linear_attention, "chunked_delta_rule", lambda q, k, v, g, beta, state: real(
        q, k, v, torch.zeros_like(g), beta, state))
    report = gptconv.verify(str(ckpt), length=48)
    assert not report.passed and report.first_divergent_step == "block.0", report.first_divergent_step


def test_norms_scaling_by_w_not_1_plus_w_fail_verify(ckpt, monkeypatch):
    """A planted fault: the RMSNorms scale by w (Llama's convention) where Qwen3.5 stores 1 + w."""
    plant(monkeypatch, offset_norms=False)
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step


@pytest.mark.parametrize("where", ["mtp.", "model.mtp."])
def test_the_multi_token_prediction_layers_are_dropped_by_name(ckpt, tmp_path, where):
    """Released files carry a draft layer for speculative decoding (``mtp.*``): each tensor is accounted for
    by a named rule, listed as dropped, and the model is the same."""
    from helpers import edited_copy
    c = gptconv.open_source(ckpt).config

    def add_mtp(state):
        state[f"{where}fc.weight"] = torch.zeros(c.d_model, 2 * c.d_model)
        state[f"{where}pre_fc_norm_embedding.weight"] = torch.zeros(c.d_model)
        state[f"{where}layers.0.self_attn.q_proj.weight"] = torch.zeros(2 * c.n_heads * c.head_dim, c.d_model)
        state[f"{where}layers.0.mlp.gate_proj.weight"] = torch.zeros(c.d_ff, c.d_model)
    folder = edited_copy(ckpt, tmp_path / "mtp", add_mtp)
    src = gptconv.open_source(folder)
    plan = src.plan(model_shapes(build_empty(src.config)))
    assert sorted(plan.dropped) == sorted(k for k in src.tensors if k.startswith(where))
    a, b = gptconv.load(folder).state_dict(), gptconv.load(ckpt).state_dict()
    assert all(a[k].equal(b[k]) for k in b)
    r = run_cli("pull", folder)
    assert r.returncode == 0 and f"dropped       4 tensors by named rules" in r.stdout and f"{where}fc.weight" in r.stdout


def test_our_gguf_verifies_against_transformers_gguf_reader(ours_gguf, parsed_once):
    """transformers 5.25 reads qwen35 files itself (its GGUF loader undoes the converter's changes): the
    reference is then transformers' own reading of our file."""
    report = gptconv.verify(str(ours_gguf), length=48)
    assert report.passed, (report.first_divergent_step, report.notes)


def test_a_head_narrower_than_llama_cpps_mrope_sections_is_not_exported():
    """llama.cpp's qwen35 rotates M-RoPE sections of 32 dimensions and aborts the process on a narrower head
    (a GGML_ASSERT, found by a 16-wide fixture): our export refuses such a model in one line."""
    from dataclasses import replace

    from gptconv.convert.gguf_hybrid import add_mrope_sections
    from gptconv.errors import GptconvError
    from gptconv.models import PRESETS as ALL
    narrow = replace(ALL["qwen3.5-0.8b"], head_dim=16, rope_dim=4)
    with pytest.raises(GptconvError, match="more than this model's head_dim 16"):
        add_mrope_sections(None, narrow, "qwen35")
