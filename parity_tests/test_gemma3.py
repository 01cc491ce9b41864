"""Gemma 3 (text) against transformers' Gemma3ForCausalLM and llama.cpp's gemma3, random init at 0.2.

The fixture has every Gemma 3 feature at a size a test can run past: six layers, five local (window
16) to one global, 96 positions; query_pre_attn_scalar 24 ≠ head_dim 16; local RoPE base 1e4 and
global 1e6 with linear scaling 8; GQA (4 query heads, 2 K/V). Norm weights are random offsets from 0
(Gemma's RMSNorm scales by 1 + w), rounded to bfloat16 as the released checkpoints store them.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

import gptconv
from gptconv.errors import GptconvError
from gptconv.models import KVCache, PRESETS, build, build_empty
from gptconv.families.gemma3 import FULL, SLIDING
from gptconv.parity.compare import FP32, LLAMA_CPP
from gptconv.writers import export
from fixtures import make_gemma3
from helpers import assert_fp32_parity, assert_generation_matches, hf_model, hf_round_trip, random_ids, run_cli

@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Path:
    return make_gemma3(tmp_path_factory.mktemp("gemma3") / "gemma3")


@pytest.fixture(scope="module")
def theirs_spm(gemma3_spm, tmp_path_factory):
    """llama.cpp's converter on gemma3_spm at a type, run once per type for the module (its output is
    a function of the folder and the type: the tests below compare it bit for bit with ours)."""
    import llama_cpp_tools
    root, made = tmp_path_factory.mktemp("theirs"), {}

    def convert(dtype: str) -> Path:
        if dtype not in made:
            made[dtype] = llama_cpp_tools.convert(gemma3_spm, root / f"theirs.{dtype}.gguf", dtype)
        return made[dtype]
    return convert


@pytest.fixture(scope="module")
def gemma3_spm(tmp_path_factory) -> Path:
    """For llama.cpp: query_pre_attn_scalar = head_dim (llama.cpp stores none and assumes head_dim, as
    for every released size but the 27B) and a SentencePiece tokenizer the converter reads."""
    return make_gemma3(tmp_path_factory.mktemp("gemma3") / "gemma3-spm", vocab="llama-spm", vocab_size=32000,
                       query_pre_attn_scalar=16)


def test_fixture_has_the_features_it_claims(gemma3):
    c = gptconv.open_source(gemma3).config
    assert c.layer_types == (SLIDING,) * 5 + (FULL,) and c.sliding_window == 16 and c.context_length == 96
    assert c.query_pre_attn_scalar == 24 != c.head_dim and c.head_dim * c.n_heads == c.d_model
    assert (c.rope_local_theta, c.rope_theta, c.rope_scaling.kind, c.rope_scaling.factor) == (1e4, 1e6, "linear", 8)
    assert c.n_kv_heads < c.n_heads and c.final_logit_softcapping is None


def test_logits_match_transformers_past_the_window(gemma3):
    ours = gptconv.load(gemma3)
    ids = random_ids(ours.config.vocab_size, ours.config.context_length)  # 96 positions: 6× the window
    with torch.no_grad():
        assert_fp32_parity(ours(ids), hf_model(gemma3)(ids).logits, "gemma3")


@pytest.mark.parametrize("change", ["no window", "local RoPE everywhere", "head_dim scale", "norm w, not 1 + w"])
def test_each_feature_matters(gemma3, change, monkeypatch):
    """The parity above checks each feature: the same weights without it are far off."""
    from gptconv.layers import norms
    ours = gptconv.load(gemma3)
    c = ours.config
    replaced = {"no window": dict(layer_types=(FULL,) * c.n_layers),
                "local RoPE everywhere": dict(rope_theta=c.rope_local_theta, rope_scaling=None),
                "head_dim scale": dict(query_pre_attn_scalar=float(c.head_dim))}.get(change, {})
    if change == "norm w, not 1 + w":
        monkeypatch.setattr(norms, "offset_rms_norm", lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.size(-1),), w, eps))
    other = build(dataclasses.replace(c, **replaced)).eval()
    other.load_state_dict(ours.state_dict())
    ids = random_ids(c.vocab_size, c.context_length)
    with torch.no_grad():
        assert (other(ids) - hf_model(gemma3)(ids).logits).abs().max() > 0.1, change


def test_kv_cache_generation_equals_recompute_and_transformers(gemma3):
    assert_generation_matches(gemma3)  # 90 new tokens: far past the window


def test_chunks_through_the_cache_match_one_pass(gemma3):
    """Prefill in chunks (shorter and longer than the window) and single steps: no window is shared by
    every layer (the global layer needs every key); each local layer's slot keeps its own window."""
    model = gptconv.load(gemma3)
    ids = random_ids(model.config.vocab_size, model.config.context_length, batch=1, seed=3)
    with torch.no_grad():
        whole = model(ids)
        cache = KVCache.for_model(model, batch=1, max_len=ids.shape[1], reserve=4)
        assert cache.window is None
        parts, at = [], 0
        for size in [5, 1, 1, 35, 7, *[1] * 40]:
            size = min(size, ids.shape[1] - at)
            parts.append(model(ids[:, at:at + size], cache=cache))
            at += size
        parts.append(model(ids[:, at:], cache=cache))
    assert_fp32_parity(torch.cat(parts, 1), whole, "gemma3 chunked through the cache")


def test_each_layer_keeps_its_own_state(gemma3):
    """The cache is a slot per layer, made by the layer's attention: generating token by token far past
    the window, each local layer keeps about twice its window (older keys forgotten), the global layer
    every position, and the logits are those of one pass."""
    model = gptconv.load(gemma3)
    c = model.config
    ids = random_ids(c.vocab_size, c.context_length, batch=1, seed=4)
    with torch.no_grad():
        whole = model(ids)
        cache = KVCache.for_model(model, batch=1, max_len=ids.shape[1], reserve=4)
        steps = [model(ids[:, i:i + 1], cache=cache) for i in range(ids.shape[1])]
    assert_fp32_parity(torch.cat(steps, 1), whole, "gemma3 token by token")
    for kind, slot in zip(c.layer_types, cache.layers):
        if kind == SLIDING:
            assert slot.window == c.sliding_window and slot.capacity <= 2 * c.sliding_window and slot.offset > 0
        else:
            assert slot.window is None and slot.capacity >= ids.shape[1] and slot.offset == 0


def test_the_cache_of_gemma_3_1b_at_its_full_context():
    """Memory of the state, from the slots' shapes on the meta device (nothing allocated): 22 local
    layers hold 2 × 512 positions, 4 global layers all 32,768."""
    model = build_empty(PRESETS["gemma-3-1b"])
    cache = KVCache.for_model(model, batch=1, max_len=32768)
    per_position = 2 * 1 * 256 * 4  # K and V, one K/V head of 256, float32
    held = sum(s.k.nelement() + s.v.nelement() for s in cache.layers) * 4
    everything = 26 * 32768 * per_position
    print(f"\ngemma-3-1b, 32,768 positions, float32: {held / 2**20:.0f} MiB of K/V (every layer whole: "
          f"{everything / 2**20:.0f} MiB)")
    assert held == (4 * 32768 + 22 * 1024) * per_position


def test_hf_export_round_trip_is_bit_exact(gemma3, tmp_path):
    hf_round_trip(gemma3, tmp_path / "out")


def test_gguf_export_loads_back_bit_exact(gemma3, tmp_path):
    out = tmp_path / "m.gguf"
    export(str(gemma3), out, "gguf", "f32")
    a, b = gptconv.load(gemma3), gptconv.load(out)
    assert dataclasses.replace(b.config, norm_eps=a.config.norm_eps) == a.config  # eps is float32 in GGUF
    for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), n
    again = tmp_path / "again.gguf"  # and GGUF → GGUF writes the same tensors
    export(str(out), again, "gguf", "f32")
    from llama_cpp_tools import differences
    keys, tensors = differences(again, out)
    assert tensors == [] and set(keys) == {"general.name"}


def test_norm_plus_one_loses_only_what_float32_cannot_hold():
    """llama.cpp stores 1 + w. A bfloat16 weight (every released checkpoint's) goes there and back
    exactly; a float32 weight keeps what 1 + w can hold: within half an ulp of 1 + w."""
    from gptconv.families.gemma3 import NORM_PLUS_ONE as T
    w = (torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 0.1)
    bf = w.bfloat16().float()
    assert torch.equal(T.forward(T.inverse(bf, None), None), bf)
    back = T.forward(T.inverse(w, None), None)
    assert not torch.equal(back, w) and (back - w).abs().max() <= 2.0**-24 * 2


def test_verify_passes_past_the_window(gemma3):
    report = gptconv.verify(str(gemma3))
    print(f"\ngemma3: verify against transformers: max|Δ| = {report.max_abs_diff:.3e} at {report.inputs['random']}")
    assert report.passed and report.inputs["random"] > 16
    names = {s.name for s in report.steps}
    assert {"token_embedding", "block.0.q_norm", "block.5.k_norm", "block.5.post_attention_norm",
            "block.0.post_feedforward_norm", "final_norm", "logits"} <= names


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_verify_passes_in_low_precision(gemma3, dtype):
    """Our norms compute in float32 and round once, our √d is rounded to the dtype first, as HF's."""
    report = gptconv.verify(str(gemma3), dtype=dtype)
    assert report.passed, (report.first_divergent_step, report.notes)


def test_trace_names_the_new_steps(gemma3):
    r = run_cli("trace", gemma3, "The capital of France is")
    assert r.returncode == 0, r.stderr
    for step in ["block.0.q_norm", "block.0.k_norm", "block.0.post_attention_norm", "block.5.post_feedforward_norm"]:
        assert step in r.stdout, step
    assert "5 local layers see their last 16 positions" in r.stdout


# Parameter counts: 270m and 1b as Google publishes them (the model cards' and the Hub's safetensors
# totals). For 4b the published 4,300,079,472 includes the SigLIP vision tower and projector; the text
# model's count is computed here from its text_config and checked against transformers' own
# Gemma3ForCausalLM on the meta device, not against a published number (none found for the text part).
PARAMETERS = {"gemma-3-270m": 268_098_176, "gemma-3-1b": 999_885_952, "gemma-3-4b": 3_880_263_168}


@pytest.mark.parametrize("name", list(PARAMETERS))
def test_presets_have_the_real_parameter_counts(name):
    import transformers
    from accelerate import init_empty_weights
    from gptconv.families.gemma3 import gemma3_config_to_hf
    ours = sum(p.numel() for p in build_empty(PRESETS[name]).parameters())
    assert ours == PARAMETERS[name]
    data = gemma3_config_to_hf(PRESETS[name])
    with init_empty_weights():
        theirs = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**{
            k: v for k, v in data.items() if k not in ("architectures", "model_type")}))
    # transformers ties the head to the embedding when it loads weights: count it once
    assert sum(p.numel() for n, p in theirs.named_parameters() if n != "lm_head.weight") == ours


def _with_config(folder: Path, dst: Path, **changes) -> Path:
    shutil.copytree(folder, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("change,message", [
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping .* is not supported"),
    (dict(use_bidirectional_attention=True), "bidirectional attention"),
    (dict(hidden_activation="gelu"), "hidden_activation 'gelu' is not supported"),
    (dict(tie_word_embeddings=False), "untied"),
    (dict(layer_types=[SLIDING] * 5), "'layer_types' must list"),
    (dict(sliding_window=None), "'sliding_window' is null"),
    (dict(rope_parameters={FULL: {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0},
                           SLIDING: {"rope_type": "default", "rope_theta": 1e4}}), "rope_type 'yarn'"),
    (dict(rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1e6},
                           SLIDING: {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}), "sliding-window layers"),
])
def test_what_is_not_implemented_is_refused_in_one_line(gemma3, tmp_path, change, message):
    d = _with_config(gemma3, tmp_path / "changed", **change)
    with pytest.raises(GptconvError, match=message) as e:
        gptconv.open_source(d)
    assert "\n" not in str(e.value) and str(d / "config.json") in str(e.value)


def test_legacy_config_reads_the_same(gemma3, tmp_path):
    """transformers 4's form: rope_theta, rope_scaling and rope_local_base_freq, sliding_window_pattern."""
    d = _with_config(gemma3, tmp_path / "legacy")
    cfg = json.loads((d / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    del cfg["layer_types"], cfg["_sliding_window_pattern"]
    cfg.update(rope_theta=params[FULL]["rope_theta"], rope_scaling={"rope_type": "linear", "factor": 8.0},
               rope_local_base_freq=params[SLIDING]["rope_theta"], sliding_window_pattern=6)
    (d / "config.json").write_text(json.dumps(cfg))
    assert gptconv.open_source(d).config == gptconv.open_source(gemma3).config


def test_gguf_export_refuses_global_layers_llama_cpp_would_not_place(gemma3, tmp_path):
    d = _with_config(gemma3, tmp_path / "pattern", layer_types=[SLIDING, SLIDING, FULL] * 2)
    assert gptconv.verify(str(d)).passed  # transformers and we place them anywhere
    with pytest.raises(GptconvError, match="every 6th layer global"):
        export(str(d), tmp_path / "m.gguf", "gguf", "f32")


# ---------------------------------------------------------------------------------------------------
# llama.cpp


def test_our_gguf_equals_llama_cpps_converter(gemma3_spm, theirs_spm, tmp_path):
    """On the same folder both converters write the same tensors (norms as 1 + w) bit for bit and the
    same metadata but the name, at f32 and q8_0."""
    import llama_cpp_tools
    for dtype in ("f32", "q8_0"):
        ours = tmp_path / f"ours.{dtype}.gguf"
        export(str(gemma3_spm), ours, "gguf", dtype)
        theirs = theirs_spm(dtype)
        keys, tensors = llama_cpp_tools.differences(ours, theirs)
        assert tensors == [] and set(keys) == {"general.name"}, (dtype, keys, tensors)


def test_llama_cpp_agrees_past_the_window(gemma3_spm, theirs_spm, tmp_path):
    ours = tmp_path / "ours.gguf"
    export(str(gemma3_spm), ours, "gguf", "f32")
    theirs = theirs_spm("f32")
    for file in (ours, theirs):
        report = gptconv.verify(str(file), against="llama.cpp", length=96)
        print(f"\ngemma3: {file.name} vs llama.cpp at 96 positions: max|Δ| = {report.max_abs_diff:.3e}")
        assert report.passed, (file, report.first_divergent_step, report.notes)
    report = gptconv.verify(str(theirs))  # the converter's file, read by transformers' own GGUF loader
    print(f"gemma3: llama.cpp's converter output vs transformers: max|Δ| = {report.max_abs_diff:.3e}")
    assert report.passed and report.max_abs_diff <= FP32.atol
    a, b = gptconv.load(theirs), gptconv.load(gemma3_spm)
    for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), n


def test_llama_cpp_assumes_head_dim_for_the_query_scale(gemma3, tmp_path):
    """A known difference, kept in sight: llama.cpp's gemma3 stores no query_pre_attn_scalar and takes
    head_dim (d / heads for the 27B). Our export keeps another scalar as attention.scale (reading the
    file back keeps it); llama.cpp ignores the key and computes what our model with head_dim computes."""
    from gptconv.llamacpp import LlamaCpp
    out = tmp_path / "m.gguf"
    export(str(gemma3), out, "gguf", "f32")
    model = gptconv.load(out)
    assert model.config.query_pre_attn_scalar == 24
    assert not gptconv.verify(str(out), against="llama.cpp", length=32).passed
    assumed = build(dataclasses.replace(model.config, query_pre_attn_scalar=16.0)).eval()
    assumed.load_state_dict(model.state_dict())
    ids = list(range(3, 99))
    with LlamaCpp(out, 96) as llm, torch.no_grad():
        theirs = torch.tensor(llm.logits(ids))
        assert (assumed(torch.tensor([ids]))[0] - theirs).abs().max() <= LLAMA_CPP["gemma3"].allowed(theirs)
