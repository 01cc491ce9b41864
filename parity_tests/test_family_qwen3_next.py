"""Qwen3-Next: Qwen3.5's hybrid decoder (``test_family_qwen3_5.py``) with routed experts (4, 2 per token) and a
shared expert on every layer, its linear layers stored grouped by key head (``in_proj_qkvz``, ``in_proj_ba``).
``family_battery.py`` runs the checks every family passes, past two chunks of the rule's prompt form."""

from __future__ import annotations

import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from gptconv.layers import mlp

ARCH = "qwen3_next"
VOCAB = "gpt-2"
SHAPE = dict(vocab_size=50257, max_position_embeddings=160, hidden_size=64, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=96, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2, linear_num_key_heads=2,
             linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
             rope_theta=10000000.0, tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)
GENERATION_LENGTH = 70  # a 6-token prompt and 64 new tokens: well past a chunk
FLOAT64_BOUND = True  # the recurrent state carries rounding along 160 positions
CONVERTER_OPTIONS = ("--no-mtp",)  # transformers saves no MTP layers, which llama.cpp's converter otherwise requires
ROUNDED_IN_GGUF = {"attn.A_log": torch.exp}  # GGUF holds −exp(A_log): read back through log
STEPS = ["block.0.linear_attention", "block.0.router", "a shared expert of 48 on every token",
         "linear attention (a gated delta rule, no position signal but order) in 3 layers (0, 1, 2)"]
# 80B in total (the card; 81.3B on the Hub with its MTP layer, which is not counted here), 3B activated
PRESETS = {"qwen3-next-80b-a3b": 79_674_391_296}


def test_the_grouped_projections_are_read_into_qwen3_5s_four(ckpt):
    """in_proj_qkvz holds, per key head, its q, k, the v and z of its value heads: ours holds all q, then all k,
    then all v (in_qkv) and z apart (in_z)."""
    from safetensors import safe_open
    c = gptconv.open_source(ckpt).config
    s, model = c.linear_attention, gptconv.load(ckpt)
    with safe_open(ckpt / "model.safetensors", "pt") as f:
        qkvz = f.get_tensor("model.layers.0.linear_attn.in_proj_qkvz.weight")
    per_group = qkvz.view(s.k_heads, -1, c.d_model)
    q_of_head_1 = per_group[1, :s.k_dim]
    attn = model.blocks[0].attn
    assert attn.in_qkv.weight[s.k_dim:2 * s.k_dim].equal(q_of_head_1)
    z_of_head_0 = per_group[0, 2 * s.k_dim + 2 * s.v_dim:]  # 2 value heads per key head: v of 2 heads, then z
    assert attn.in_z.weight[:2 * s.v_dim].equal(z_of_head_0)


def test_the_shared_expert_ungated_fails_verify(ckpt, monkeypatch):
    """A planted fault: the shared expert's output added without its sigmoid gate."""
    monkeypatch.setattr(mlp.MoE, "gated_shared", lambda self, x: self.shared(x))
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step


def test_transformers_cannot_read_qwen3next_gguf_and_verify_says_so_in_one_line(ours_gguf):
    from helpers import run_cli
    r = run_cli("verify", ours_gguf, "--length", "16")
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "transformers cannot read this GGUF file" in r.stderr and "--against llama.cpp" in r.stderr


def test_an_mtp_layer_of_experts_exports_as_llama_cpps_converter_writes_it(ckpt, tmp_path):
    """Qwen3-Next's MTP layer routes to experts too, and its config.json has no ``mtp_num_hidden_layers`` (the
    converter counts the layers from the tensors, as we do): block 4 and ``blk.4.nextn.*``, equal to the
    converter's file tensor for tensor, read back to the folder's weights; HF export writes ``mtp.*`` back."""
    import llama_cpp_tools
    from gptconv.api import export
    from helpers import with_mtp_layer
    folder = with_mtp_layer(ckpt, tmp_path / "mtp", config_key=False)
    model = gptconv.load(folder)
    assert model.config.mtp_layers == 1 and len(model.mtp.layers[0].mlp.experts) == 4
    ours = export(str(folder), tmp_path / "ours.gguf", "gguf", "f32").out
    keys, tensors = llama_cpp_tools.differences(ours, llama_cpp_tools.convert(folder, tmp_path / "theirs.gguf", "f32"))
    assert tensors == [] and set(keys) <= {"general.name"}, (keys, tensors)
    back, state = gptconv.load(ours).state_dict(), model.state_dict()
    assert back.keys() == state.keys()
    assert all(back[k].equal(v) for k, v in state.items() if k.startswith("mtp."))
    hf = gptconv.load(export(str(folder), tmp_path / "hf", "safetensors").out).state_dict()
    assert all(hf[k].equal(v) for k, v in state.items() if k.startswith("mtp."))
