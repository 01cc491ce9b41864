"""Qwen3-MoE: Qwen3's per-head q/k norms with routed experts (4 of them here, 2 chosen per token, their
weights not renormalised as transformers' default says), one dense layer among them (mlp_only_layers)
and a window on every layer (use_sliding_window). ``family_battery.py`` runs the checks every family
passes; llama.cpp's qwen3moe has experts on every layer, always renormalises and has no window, so its
tests convert the checkpoint without these (GGUF_CHANGES), and the tests below show the refusals."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from gptconv.errors import GptconvError
from gptconv.writers import export

ARCH = "qwen3_moe"
VOCAB = "qwen2"  # transformers reads a qwen3_moe folder's tokenizer as Qwen2's: llama.cpp's converter then
# recognises Qwen2's pre-tokenizer only
SHAPE = dict(vocab_size=151936, max_position_embeddings=64, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
             num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1], use_sliding_window=True,
             sliding_window=12, rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643,
             eos_token_id=151645)
GGUF_CHANGES = dict(mlp_only_layers=[], norm_topk_prob=True, use_sliding_window=False)
STEPS = ["block.0.q_norm", "block.0.router", "2 of 4 experts per token (weights not renormalised); 1 dense layers",
         "each position sees the last 12 only"]
# the card: 30.5B in total, 3.3B activated (3.35B: 120 of 128 experts' 3 × 2048 × 768 left out in each
# of the 48 layers), 29.9B without the embedding and the head
PRESETS = {"qwen3-30b-a3b": 30_532_122_624}


def test_the_preset_activates_3_3b_without_its_embeddings_29_9b():
    from gptconv.models import PRESETS as ALL
    c = ALL["qwen3-30b-a3b"]
    unused = c.n_layers * (c.experts.count - c.experts.used) * 3 * c.d_model * c.experts.d_ff
    assert f"{(PRESETS['qwen3-30b-a3b'] - unused) / 1e9:.3f}" == "3.353"  # the card's 3.3B, truncated
    assert f"{(PRESETS['qwen3-30b-a3b'] - 2 * c.vocab_size * c.d_model) / 1e9:.1f}" == "29.9"


def test_the_dense_layer_and_the_unnormalised_weights_are_read(ckpt):
    c = gptconv.open_source(ckpt).config
    assert [c.experts_at(i) for i in range(3)] == [True, False, True]
    assert not c.experts.renormalise and c.experts.d_ff == 32 and c.d_ff == 128 and c.attention.window == 12


def test_llama_cpps_qwen3moe_has_no_place_for_dense_layers_unnormalised_weights_or_a_window(ckpt, tmp_path):
    """Our GGUF export refuses the checkpoint, naming what llama.cpp's qwen3moe lacks (llama.cpp's
    converter fails on its dense layer's tensors; on unnormalised weights alone it writes a file that
    llama.cpp runs renormalised)."""
    with pytest.raises(GptconvError) as e:
        export(str(ckpt), tmp_path / "x.gguf", "gguf", "f32")
    assert "dense layers among experts" in str(e.value) and "unnormalised expert weights" in str(e.value)


def test_the_experts_saved_fused_are_read_alike(ckpt, tmp_path):
    """transformers 5's module layout (gate_up_proj, down_proj per layer), as save_original_format=False
    writes it: the same model."""
    from helpers import assert_fused_experts_read_alike
    assert_fused_experts_read_alike(ckpt, tmp_path / "fused")


def test_renormalised_weights_fail_verify_at_the_first_expert_layer(ckpt, monkeypatch):
    """A planted fault: the chosen experts' weights renormalised where the config says not."""
    plant_experts(monkeypatch, renormalise=True)
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step


def test_the_dense_layer_with_the_expert_size_fails(ckpt, monkeypatch):
    """A planted fault: the dense layer built with the experts' hidden size; its tensors do not fit."""
    from gptconv.layers.mlp import MLPOptions, SwiGLU
    monkeypatch.setattr(MLPOptions, "make", lambda self, d, d_ff: SwiGLU(d, 32, self.bias))
    with pytest.raises(GptconvError, match="wrong shape"):
        gptconv.load(ckpt)


def test_llama_cpps_converter_writes_unnormalised_weights_as_renormalised(gguf_ckpt, theirs, tmp_path):
    """llama.cpp's qwen3moe renormalises the chosen weights always (its graph says so; no key says
    otherwise): its converter writes a norm_topk_prob=False folder as the very file it writes for
    norm_topk_prob=True, which llama.cpp runs renormalised (the battery verifies that file against
    llama.cpp). Our export refuses the folder rather than write a file llama.cpp would run otherwise."""
    import json

    import llama_cpp_tools
    folder = tmp_path / "unnormalised"
    folder.mkdir()
    for f in gguf_ckpt.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    assert config["norm_topk_prob"] is True
    (folder / "config.json").write_text(json.dumps({**config, "norm_topk_prob": False}))
    keys, tensors = llama_cpp_tools.differences(llama_cpp_tools.convert(folder, tmp_path / "theirs.gguf"), theirs)
    assert tensors == [] and set(keys) <= {"general.name"}, (keys, tensors)
    with pytest.raises(GptconvError, match="unnormalised expert weights"):
        export(str(folder), tmp_path / "ours.gguf", "gguf", "f32")
