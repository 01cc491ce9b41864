"""Mistral (sliding window), Qwen3 (QK-norm), Phi-3 (fused qkv and gate/up) and Mixtral (mixture of
experts) against transformers, random init at 0.2, every test run past every window."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gptconv
from fixtures import FAMILY_SHAPES
from gptconv.models import KVCache, build
from gptconv.writers import export
from helpers import assert_generation_matches, assert_fp32_parity, hf_model, hf_round_trip, random_ids, run_cli

FAMILIES = list(FAMILY_SHAPES)
WINDOWED = ["mistral-swa", "phi3"]


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_match_transformers_past_every_window(families, name):
    ours = gptconv.load(families[name])
    window = ours.config.attention.window or 0
    assert ours.config.context_length >= 4 * window  # 96 positions: 6× Mistral's window, 4.8× Phi-3's
    ids = random_ids(ours.config.vocab_size, ours.config.context_length)
    with torch.no_grad():
        assert_fp32_parity(ours(ids), hf_model(families[name])(ids).logits, name)


def test_fixtures_have_the_features_they_claim(families):
    cfg = {n: gptconv.open_source(families[n]).config for n in FAMILIES}
    assert cfg["mistral-swa"].attention.window == 16 and cfg["phi3"].attention.window == 20
    assert cfg["qwen3"].attention.qk_norm and cfg["qwen3"].head_dim * cfg["qwen3"].n_heads != cfg["qwen3"].d_model
    assert (cfg["mixtral"].experts.count, cfg["mixtral"].experts.used) == (4, 2)
    assert {c.family for c in cfg.values()} == {"mistral", "qwen3", "phi3", "mixtral"}


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("drop", [("rms_norm_eps", "sliding_window", "max_window_layers"),
                                  ("rope_parameters", "rope_theta", "rope_scaling")])
def test_a_field_left_out_means_what_transformers_reads(families, tmp_path, name, drop):
    """Defaults differ by family (Mistral's window 4096, Mixtral's eps 1e-5 and theta 1e6, …)."""
    import json
    import shutil
    from transformers import AutoConfig
    folder = tmp_path / name
    shutil.copytree(families[name], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in drop}))
    ours, theirs = gptconv.open_source(folder).config, AutoConfig.from_pretrained(folder)
    params = getattr(theirs, "rope_parameters", None) or {}
    assert ours.norms.eps == theirs.rms_norm_eps
    assert ours.rope.theta == params.get("rope_theta", getattr(theirs, "rope_theta", None))
    layer_types = getattr(theirs, "layer_types", None) or []
    windowed = getattr(theirs, "sliding_window", None) is not None and (
        not layer_types or all(t == "sliding_attention" for t in layer_types))
    assert ours.attention.window == (theirs.sliding_window if windowed else None)


@pytest.mark.parametrize("name", WINDOWED)
def test_without_its_window_the_model_is_far_off(families, name):
    """The parity above checks the window: the same weights attending to everything differ at once."""
    ours = gptconv.load(families[name])
    full = build(dataclasses.replace(ours.config, attention=dataclasses.replace(ours.config.attention, window=None))).eval()
    full.load_state_dict(ours.state_dict())
    ids = random_ids(ours.config.vocab_size, ours.config.context_length)
    with torch.no_grad():
        assert (full(ids) - hf_model(families[name])(ids).logits).abs().max() > 1.0


@pytest.mark.parametrize("name", FAMILIES)
def test_kv_cache_generation_equals_recompute_and_transformers(families, name):
    assert_generation_matches(families[name])  # 90 new tokens: far past every window


@pytest.mark.parametrize("name", WINDOWED)
def test_windowed_cache_is_bounded_and_chunks_match_one_pass(families, name):
    """Prefill in chunks (shorter and longer than the window) and single steps, through a cache that
    forgets what no query can see: the logits of one pass over everything, and memory within 2× the window."""
    model = gptconv.load(families[name])
    window = model.config.attention.window
    ids = random_ids(model.config.vocab_size, model.config.context_length, batch=1, seed=3)
    with torch.no_grad():
        whole = model(ids)
        cache = KVCache.for_model(model, batch=1, max_len=ids.shape[1], reserve=4)
        parts, at = [], 0
        for size in [5, 1, 1, 2 * window + 3, 7, *[1] * 40]:
            size = min(size, ids.shape[1] - at)
            parts.append(model(ids[:, at:at + size], cache=cache))
            at += size
        decode_capacity = cache.capacity
        parts.append(model(ids[:, at:], cache=cache))
    # other kernels (masked chunks, single steps) sum in other orders: fp32 rounding, within FP32
    assert_fp32_parity(torch.cat(parts, 1), whole, f"{name} chunked through the cache")
    assert cache.pos == ids.shape[1] and cache.offset > 0
    assert decode_capacity <= 3 * window + 3  # grew once for the long chunk (window − 1 + 2·window + 3), no more


@pytest.mark.parametrize("name", FAMILIES)
def test_hf_export_round_trip_is_bit_exact(families, tmp_path, name):
    hf_round_trip(families[name], tmp_path / "out")


@pytest.mark.parametrize("name", FAMILIES)
def test_gguf_export_loads_back_bit_exact(families, tmp_path, name):
    out = tmp_path / "m.gguf"
    export(str(families[name]), out, "gguf", "f32")
    a, b = gptconv.load(families[name]), gptconv.load(out)
    assert dataclasses.replace(b.config, norms=a.config.norms) == a.config  # eps is float32 in GGUF
    for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), n


@pytest.mark.parametrize("name", FAMILIES)
def test_verify_passes_past_the_window(families, name):
    report = gptconv.verify(str(families[name]))
    window = gptconv.open_source(families[name]).config.attention.window or 0
    print(f"\n{name}: verify against transformers: max|Δ| = {report.max_abs_diff:.3e}")
    assert report.passed and report.inputs["random"] > window


def test_trace_names_the_new_steps(families):
    for name, steps in [("qwen3", ["block.0.q_norm", "block.0.k_norm"]),
                        ("mixtral", ["block.0.router", "block.0.chosen_experts", "block.1.router"])]:
        r = run_cli("trace", families[name], "The capital of France is")
        assert r.returncode == 0, r.stderr
        for step in steps:
            assert step in r.stdout, (name, step)


def test_a_router_without_renormalising_fails_verify(families, monkeypatch):
    """Mixtral renormalises the chosen experts' probabilities to sum to 1; leaving that out fails at block.0."""
    from gptconv.layers import mlp
    real = mlp.MoE.forward

    def unnormalised(self, x, tap=mlp.no_tap):
        probs = torch.softmax(self.router(x).float(), -1)
        top, _ = probs.topk(self.top_k, -1)
        return real(self, x, tap) * top.sum(-1, keepdim=True).view(*x.shape[:-1], 1).to(x.dtype)
    monkeypatch.setattr(mlp.MoE, "forward", unnormalised)
    report = gptconv.verify(str(families["mixtral"]), length=32)
    assert not report.passed and report.first_divergent_step == "block.0"


def test_qwen3_with_q_and_k_norms_swapped_is_far_off(families, tmp_path):
    """q_norm and k_norm have the same shape: a table that crossed them would pass every shape check,
    and the parity test (within FP32) would not."""
    from gptconv.parity.compare import FP32
    from helpers import edited_copy

    def swap(state):
        for i in range(2):
            q, k = f"model.layers.{i}.self_attn.q_norm.weight", f"model.layers.{i}.self_attn.k_norm.weight"
            state[q], state[k] = state[k].clone(), state[q].clone()
    ours = gptconv.load(edited_copy(families["qwen3"], tmp_path / "swapped", swap))
    ids = random_ids(ours.config.vocab_size, 32)
    with torch.no_grad():
        assert (ours(ids) - hf_model(families["qwen3"])(ids).logits).abs().max() > 100 * FP32.atol


@pytest.mark.parametrize("name", FAMILIES)
def test_k_quants_from_llama_cpps_quantizer_load_and_match_llama_cpp(wide_families, tmp_path, name):
    """Our f32 export quantized to Q4_K_M by llama.cpp's own quantizer (Mixtral's stacked experts
    included): gptconv dequantizes every tensor as llama.cpp does, and the two agree (within the
    window: llama.cpp attends past it, see test_llama_cpp_ignores_sliding_windows)."""
    import llama_cpp_tools
    from gguf import GGUFReader
    f32 = export(str(wide_families[name]), tmp_path / "m.gguf", "gguf", "f32").out
    q = llama_cpp_tools.quantize(f32, tmp_path / "m.q4_k_m.gguf", "Q4_K_M")
    types = {t.tensor_type.name for t in GGUFReader(q).tensors}
    assert {"Q4_K", "Q6_K"} <= types, types
    model = gptconv.load(q)
    window = model.config.attention.window
    report = gptconv.verify(str(q), against="llama.cpp", length=window)
    print(f"\n{name} Q4_K_M ({sorted(types)}) vs llama.cpp: max|Δ| = {report.max_abs_diff:.3e}")
    assert report.passed, (report.first_divergent_step, report.notes)


@pytest.mark.parametrize("name,change,message", [
    ("mixtral", {"num_experts_per_tok": 5}, "experts: used = 5 is not an integer in 1 … 4"),
    ("mixtral", {"num_local_experts": 0}, "experts: count = 0 is not an integer"),
    ("mistral-swa", {"sliding_window": 0}, "field 'sliding_window' is 0; it must be at least 1"),
    ("qwen3", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}},
     "rope_type 'dynamic' is not supported"),
    ("phi3", {"rope_scaling": {"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}},
     "longrope has 1 RoPE factors for 8 frequencies"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": None, "layer_types": ["sliding_attention", "full_attention"]},
     "'sliding_window' is null or absent but some layers are sliding_attention"),
])
def test_what_we_do_not_implement_is_one_line_and_exit_2(families, tmp_path, name, change, message):
    import json
    import shutil
    bad = tmp_path / name
    shutil.copytree(families[name], bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, **change}))
    r = run_cli("trace", bad, "hi")
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
