"""Qwen3.5 dense (qwen3_5_text): three linear-attention layers (a gated delta rule: 2 key heads, 4 value heads,
so the value heads share keys; value heads as wide as key heads, as llama.cpp needs: ``test_linear_attention.py``
compares wider ones with transformers) and one gated full-attention layer with partial rotary (8 of 32) and q/k
norms, every RMSNorm scaling by 1 + w. ``family_battery.py`` runs the checks every family passes; the
checkpoint's context (160) is past two chunks (64) of the rule's prompt form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from family_battery import plant_part
from gptconv.layers.norms import Norms
from gptconv.convert.keymap import model_shapes
from gptconv.layers import linear_attention
from gptconv.models import build_empty
import llama_cpp_tools
from gptconv.api import export
from gptconv.loader import load_source
from helpers import run_cli, with_mtp_layer

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
    assert c.rope.dim == 8 and c.attention.gate and c.norms.offset and c.linear_attention.v_heads == 4


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
    plant_part(monkeypatch, Norms, offset=False)
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step


@pytest.fixture(scope="module")
def mtp_ckpt(ckpt):
    return with_mtp_layer(ckpt, ckpt.parent / "mtp")


@pytest.mark.parametrize("where", ["mtp.", "model.mtp."])
def test_the_multi_token_prediction_layers_are_held_not_run(ckpt, mtp_ckpt, tmp_path, where):
    """Released files carry a draft layer for speculative decoding (``mtp.*``, some ``model.mtp.*``): the model
    holds every tensor of it (its count from the tensors), the trace does not run it, pull lists it."""
    folder = mtp_ckpt if where == "mtp." else with_mtp_layer(ckpt, tmp_path / "mtp", where)
    src = gptconv.open_source(folder)
    assert src.config.mtp_layers == 1
    model, trunk = load_source(src), gptconv.load(ckpt)
    file = {k: t.load() for k, t in src.tensors.items() if k.startswith(where)}
    ours = {k: v for k, v in model.state_dict().items() if k.startswith("mtp.")}
    assert len(ours) == 16 and len(file) == 15 and sorted(src.held) == sorted(file)  # q_proj: q and the gate
    assert ours["mtp.fc.weight"].equal(file[f"{where}fc.weight"])
    assert ours["mtp.enorm.weight"].equal(file[f"{where}pre_fc_norm_embedding.weight"])
    assert ours["mtp.layers.0.attn.gate.weight"].equal(file[f"{where}layers.0.self_attn.q_proj.weight"].view(
        4, 2, 32, 64)[:, 1].reshape(128, 64))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert model(ids).equal(trunk(ids))
    r = run_cli("pull", folder)
    assert r.returncode == 0 and "held          15 tensors of the multi-token-prediction layers" in r.stdout, r.stdout


def test_a_config_naming_mtp_layers_the_file_lacks_loads_without_them(ckpt, tmp_path):
    """A transformers save keeps config.json's ``mtp_num_hidden_layers`` but not the layers: the tensors decide."""
    import shutil
    folder = shutil.copytree(ckpt, tmp_path / "resaved")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}))
    assert gptconv.open_source(folder).config.mtp_layers == 0 and gptconv.pull(str(folder)).held == []


def test_mtp_layers_export_as_llama_cpps_converter_writes_them(mtp_ckpt, tmp_path):
    """GGUF: the MTP layer as block 4 and ``blk.4.nextn.*``, equal to the converter's file (without --no-mtp)
    tensor for tensor; both read back to the folder's weights; llama.cpp runs the file. HF export writes
    ``mtp.*`` back bit for bit, with ``mtp_num_hidden_layers``."""
    from safetensors import safe_open
    ours = export(str(mtp_ckpt), tmp_path / "ours.gguf", "gguf", "f32").out
    theirs = llama_cpp_tools.convert(mtp_ckpt, tmp_path / "theirs.gguf", "f32")
    keys, tensors = llama_cpp_tools.differences(ours, theirs)
    assert tensors == [] and set(keys) <= {"general.name"}, (keys, tensors)
    assert "blk.4.nextn.eh_proj.weight" in gptconv.open_source(theirs).tensors
    folder = gptconv.load(mtp_ckpt).state_dict()
    for gguf in (ours, theirs):
        back = gptconv.load(gguf).state_dict()
        assert back.keys() == folder.keys()
        for k, v in folder.items():
            assert (back[k].equal(v) if not k.endswith("A_log") else
                    torch.allclose(back[k].exp(), v.exp(), rtol=2**-22, atol=0)), (gguf.name, k)
    report = gptconv.verify(str(ours), against="llama.cpp", length=48)
    assert report.passed, (report.first_divergent_step, report.notes)
    hf = Path(export(str(mtp_ckpt), tmp_path / "hf", "safetensors").out)
    assert json.loads((hf / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    with safe_open(mtp_ckpt / "model.safetensors", "pt") as a, safe_open(hf / "model.safetensors", "pt") as b:
        released = sorted(k for k in a.keys() if k.startswith("mtp."))
        assert released == sorted(k for k in b.keys() if k.startswith("mtp."))
        assert all(a.get_tensor(k).equal(b.get_tensor(k)) for k in released)


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
    narrow = replace(ALL["qwen3.5-0.8b"], head_dim=16, rope=replace(ALL["qwen3.5-0.8b"].rope, dim=4))
    with pytest.raises(GptconvError, match="more than this model's head_dim 16"):
        add_mrope_sections(None, narrow, "qwen35")
