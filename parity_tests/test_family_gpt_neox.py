"""GPT-NeoX (Pythia, GPT-NeoX-20B): the decoder with LayerNorm, an ungated GELU MLP, biases everywhere, RoPE
on a quarter of each head and a parallel residual; q, k, v fused and interleaved by head (``family_battery.py``
runs the checks every family passes)."""

from __future__ import annotations

import json

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
import llama_cpp_tools
from fixtures import make_checkpoint
from gptconv.layers.norms import Norms
from helpers import assert_fp32_parity, hf_model, random_ids

ARCH = "gpt_neox"
VOCAB = "gpt-2"
SHAPE = dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, rotary_pct=0.25, use_parallel_residual=True, bos_token_id=50256,
             eos_token_id=50256, pad_token_id=50256)
# the released config.json's legacy names, which transformers 5 does not write and llama.cpp's converter reads
CONFIG_JSON = dict(rotary_pct=0.25, rotary_emb_base=10000)
CONVERTER_OPTIONS = (llama_cpp_tools.RAW_CONFIG,)  # see the last test
KNOWN = {"general.file_type": "llama.cpp's gptneox converter writes none (its parameters skip the base class's); ours "
                              "says the file's type, as for every other architecture"}
STEPS = ["parallel residual", "LayerNorm", "MLP: down(gelu(up(x))), ungated, with biases",
         "partial rotary: RoPE on the first 4 of 16 dimensions"]
# the Pythia suite's model cards and the GPT-NeoX-20B paper
PRESETS = {"pythia-70m": 70_426_624, "pythia-160m": 162_322_944, "pythia-410m": 405_334_016,
           "pythia-1b": 1_011_781_632, "pythia-1.4b": 1_414_647_808, "pythia-2.8b": 2_775_208_960,
           "pythia-6.9b": 6_857_302_016, "pythia-12b": 11_846_072_320, "gpt-neox-20b": 20_554_567_680}


def test_the_parts_are_read(ckpt):
    c = gptconv.open_source(ckpt).config
    assert (c.norms.kind, c.norms.place, c.norms.eps) == ("layer", "parallel", 1e-5)
    assert (c.mlp.gated, c.mlp.act, c.mlp.bias) == (False, "gelu", True)
    assert c.attention.qkv_bias and c.attention.o_bias and c.rope.dim == 4 and c.n_kv_heads == c.n_heads


def test_the_sequential_block_equals_transformers(tmp_path):
    """use_parallel_residual false: x + attn(norm1(x)), then + mlp(norm2(·)), as transformers runs it."""
    folder = make_checkpoint(tmp_path / "hf", ARCH, VOCAB, {**SHAPE, "use_parallel_residual": False})
    ours = gptconv.load(folder)
    assert ours.config.norms.place == "pre"
    ids = random_ids(ours.config.vocab_size, 64)
    with torch.no_grad():
        assert_fp32_parity(ours(ids), hf_model(folder)(ids).logits, "gpt_neox sequential")


def test_a_config_without_the_rotary_fields_reads_as_transformers_does(ckpt, tmp_path):
    """No rotary_pct and no rope_parameters: transformers takes a quarter of each head, base 10000."""
    data = json.loads((ckpt / "config.json").read_text())
    for key in ("rotary_pct", "rotary_emb_base", "rope_parameters"):
        data.pop(key, None)
    from gptconv.families.gpt_neox import config_from_hf
    c = config_from_hf(data, "config.json")
    assert (c.rope.dim, c.rope.theta) == (4, 10000.0)


def test_parallel_read_as_sequential_fails_verify(ckpt, monkeypatch):
    """A planted fault: the parallel block wired sequentially (the MLP reading x + attn)."""
    plant_part(monkeypatch, Norms, place="pre")  # noqa: F405
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step


def test_qkv_read_as_concatenated_fails_verify(ckpt, monkeypatch):
    """A planted fault: query_key_value split as q, k, v one after the other (llama.cpp's layout), not by head."""
    from gptconv.families import gpt_neox
    monkeypatch.setattr(gpt_neox, "PER_HEAD_QKV", gpt_neox.QKV)
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step


def test_gelu_new_is_read_and_refused_at_gguf_export(tmp_path):
    """hidden_act gelu_new (the tanh GELU) equals transformers; a GPT-NeoX GGUF names no activation, so it is
    not written as one that would be read back as exact GELU."""
    folder = make_checkpoint(tmp_path / "hf", ARCH, VOCAB, {**SHAPE, "hidden_act": "gelu_new"}, config_json=CONFIG_JSON)
    ours = gptconv.load(folder)
    assert ours.config.mlp.act == "gelu_tanh"
    ids = random_ids(ours.config.vocab_size, 32)
    with torch.no_grad():
        assert_fp32_parity(ours(ids), hf_model(folder)(ids).logits, "gpt_neox gelu_new")
    with pytest.raises(gptconv.GptconvError, match="gelu_new would be read back as another model; not exported"):
        gptconv.export(str(folder), tmp_path / "m.gguf", "gguf", "f32")


def test_llama_cpps_converter_as_shipped_cannot_convert_a_gpt_neox_folder(ckpt, tmp_path):
    """With transformers 5 installed, llama.cpp's converter reads config.json through AutoConfig, whose dict
    has no rotary_pct, and its gptneox model class fails on it: KeyError. The battery compares with the
    converter reading config.json as it is (``CONVERTER_OPTIONS``), as it does without transformers."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(llama_cpp_tools.source() / "convert_hf_to_gguf.py"), str(ckpt),
                        "--outfile", str(tmp_path / "theirs.gguf"), "--outtype", "f32"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "KeyError: 'rotary_pct'" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("fault", ["parallel read as sequential", "RoPE over the whole head"])
def test_a_misread_gguf_fails_verify_against_llama_cpp(ours_gguf, monkeypatch, fault):
    """llama.cpp's GELU (ggml's float16 table) widens the bound to GPT-2's: a misread file stays far above it."""
    import dataclasses
    from gptconv import families
    from gptconv.families import gpt_neox
    change = {"parallel read as sequential": lambda c: dataclasses.replace(c, norms=dataclasses.replace(c.norms, place="pre")),
              "RoPE over the whole head": lambda c: dataclasses.replace(c, rope=dataclasses.replace(c.rope, dim=0))}[fault]
    misread = dataclasses.replace(families.BY_NAME["gpt_neox"],
                                  config_from_gguf=lambda f, t: change(gpt_neox.config_from_gguf(f, t)))
    monkeypatch.setitem(families.BY_GGUF_ARCH, "gptneox", (misread,))
    report = gptconv.verify(str(ours_gguf), against="llama.cpp", length=32)
    assert not report.passed and report.max_abs_diff > 1.0, report.max_abs_diff
