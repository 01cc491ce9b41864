"""DeepSeek-V3 (deepseek_v3): multi-head latent attention (q through a low-rank step, keys and values from a
32-wide latent, a 16-dim rotated part shared by the heads, the releases' interleaved rows), YaRN ×4 from 32 with
DeepSeek's mscale on the attention scale, one dense layer then experts routed DeepSeek's way (sigmoid scores, a
bias on the choice, 2 of 4 groups, 2 of 8 experts, × 2.5) beside an ungated shared expert. ``family_battery.py``
runs the checks every family passes."""

from __future__ import annotations

import re

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from fixtures import fp8_folder
from gptconv.writers import export
from helpers import (assert_planted_fault_fails, assert_verifies_at_fp32_and_bf16, recorded_reference,
                     with_trailing_mtp_layer)

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


@pytest.fixture(scope="module")
def recorded(ckpt, tmp_path_factory):
    return recorded_reference(ckpt, tmp_path_factory.mktemp("ref"))


@pytest.mark.parametrize("fault", ["rotated rows left interleaved", "choice bias left out", "groups left out",
                                   "routed scaling left out", "mscale left out"])
def test_planted_faults_fail_verify(ckpt, recorded, monkeypatch, fault):
    """Each of DeepSeek's own steps, done another way, is caught by verify against transformers."""
    from dataclasses import replace
    from gptconv.convert import mla as deepseek_layout
    from gptconv.layers import mlp
    if fault == "rotated rows left interleaved":
        monkeypatch.setattr(deepseek_layout, "_rope_rows", lambda t, groups, rope, to_halves: t)
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
        plant_experts(monkeypatch, groups=(1, 1))
    elif fault == "routed scaling left out":
        plant_experts(monkeypatch, scaling=1.0)
    else:
        from gptconv.layers.decoder import DecoderConfig
        real = DecoderConfig.__post_init__

        def planted(self):
            real(self)
            if self.mla is not None:
                object.__setattr__(self, "mla", replace(self.mla, scale=self.mla.qk_head_dim ** -0.5))
        monkeypatch.setattr(DecoderConfig, "__post_init__", planted)
    assert_planted_fault_fails(ckpt, recorded, fault)


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


# --- FP8: the weights as DeepSeek-V3 / R1 and Kimi K2 ship them ---------------------------------------------

@pytest.fixture(scope="module")
def fp8_ckpt(ckpt, tmp_path_factory):
    return fp8_folder(ckpt, tmp_path_factory.mktemp("deepseek-fp8") / "hf", 16)


def test_fp8_weights_read_as_transformers_dequantizes_them(fp8_ckpt):
    """Bit for bit the weights transformers' model holds after its own dequantization (on CPU it dequantizes
    as it loads); each weight and its scales are one tensor to the ledger."""
    import transformers
    src = gptconv.open_source(str(fp8_ckpt))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(fp8_ckpt, dtype=torch.float32).state_dict()
    fp8 = [k for k, t in src.stored_types.items() if t == "FP8"]
    assert len(fp8) == 3 * 5 + 3 + 2 * (3 * 8 + 3)  # attention 5 a layer; 1 dense MLP; 2 layers of 8 experts + shared
    for name in fp8:
        expert = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight", name)
        if expert:  # transformers holds a layer's experts fused: gate and up rows in one tensor, down in another
            layer, j, kind = expert.group(1), int(expert.group(2)), expert.group(3)
            held = theirs[f"{layer}.down_proj"][j] if kind == "down" else \
                theirs[f"{layer}.gate_up_proj"][j].chunk(2)[kind == "up"]
        else:
            held = theirs[name]
        assert torch.equal(src.tensors[name].load(), held), name


def test_fp8_checkpoint_verifies_against_transformers(fp8_ckpt):
    assert_verifies_at_fp32_and_bf16(fp8_ckpt, "FP8")


def test_fp8_gguf_equals_llama_cpps_converter_with_blocks_cut_short(ckpt, tmp_path):
    """In blocks of 32, which several of the fixture's dimensions (48, 80, 20·4) are no multiple of: our GGUF of
    the FP8 folder equals llama.cpp's converter's, which dequantizes the same way, tensor for tensor."""
    import llama_cpp_tools
    folder = fp8_folder(ckpt, tmp_path / "fp8", 32)
    ours = export(str(folder), tmp_path / "ours.gguf", "gguf", "f32").out
    keys, tensors = llama_cpp_tools.differences(ours, llama_cpp_tools.convert(folder, tmp_path / "theirs.gguf", "f32"))
    assert tensors == [], tensors


@pytest.mark.parametrize("case", ["scales do not fit", "not float8", "no weight", "bad block size"])
def test_a_bad_fp8_pair_is_one_line_naming_it(case, tmp_path):
    from gptconv.convert.keymap import TensorInfo
    from gptconv.errors import GptconvError
    from gptconv.sources.quantized import dequantized
    info = lambda shape, dtype: TensorInfo(shape, dtype, lambda: None)  # noqa: E731
    tensors = {"w.weight": info((48, 64), torch.float8_e4m3fn), "w.weight_scale_inv": info((2, 2), torch.float32)}
    q = {"quant_method": "fp8", "weight_block_size": [32, 32]}
    if case == "scales do not fit":
        tensors["w.weight_scale_inv"] = info((1, 2), torch.float32)
    elif case == "not float8":
        tensors["w.weight"] = info((48, 64), torch.bfloat16)
    elif case == "no weight":
        del tensors["w.weight"]
    else:
        q["weight_block_size"] = [32]
    with pytest.raises(GptconvError) as e:
        dequantized(tensors, {"quantization_config": q}, tmp_path / "config.json")
    assert "\n" not in str(e.value) and "config.json" in str(e.value)
    if case != "bad block size":
        assert "w.weight" in str(e.value)


def test_the_mtp_layer_is_dropped_by_name(ckpt, tmp_path):
    """DeepSeek-V3's files hold a multi-token-prediction layer after the trunk (model.layers.61 in the release):
    dropped by name, as transformers drops it (llama.cpp's converter skips it too), and listed."""
    from gptconv.loader import load_source
    src = gptconv.open_source(str(with_trailing_mtp_layer(ckpt, tmp_path / "mtp", 3)))
    model, plain = load_source(src), gptconv.load(str(ckpt))
    assert {n.split(".")[2] for n in src.dropped} == {"3"} and "model.layers.3.shared_head.head.weight" in src.dropped
    for (a, x), (b, y) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert a == b and torch.equal(x, y), a


def test_kimi_k2s_model_type_reads_as_deepseek_v3(ckpt, tmp_path):
    """Kimi K2's config.json says model_type kimi_k2 (with DeepSeek-V3's fields): the same model."""
    import json
    import shutil
    folder = tmp_path / "kimi"
    shutil.copytree(ckpt, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "kimi_k2"}))
    assert gptconv.open_source(str(folder)).config == gptconv.open_source(str(ckpt)).config
