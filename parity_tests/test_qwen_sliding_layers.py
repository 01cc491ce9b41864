"""Qwen2 / Qwen3 with sliding windows on some layers only (``use_sliding_window`` with ``layer_types``, or
``max_window_layers``): each layer attends within its own window, as transformers; llama.cpp's qwen2 /
qwen3 have no window, so GGUF export refuses in one line."""

from __future__ import annotations

import pytest
import torch

import gptconv
from fixtures import make_family
from gptconv.models import KVCache
from helpers import assert_fp32_parity, assert_generation_matches, hf_model, hf_round_trip, random_ids, run_cli

WINDOWED = {
    # Qwen2.5's rule: layers from max_window_layers on slide
    "qwen2": ("mistral-swa", "qwen2", dict(use_sliding_window=True, sliding_window=12, max_window_layers=1)),
    # Qwen3 with layer_types said explicitly, the first layer sliding
    "qwen3": ("qwen3", "qwen3", dict(use_sliding_window=True, sliding_window=12, num_hidden_layers=3,
                                     layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
}


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    from fixtures import FAMILY_SHAPES
    out = {}
    for name, (shape, model_type, changes) in WINDOWED.items():
        base = {k: v for k, v in FAMILY_SHAPES[shape][1].items() if k != "sliding_window"}
        FAMILY_SHAPES[f"_{name}"] = (model_type, {**base, **changes})
        try:
            out[name] = make_family(tmp_path_factory.mktemp(name) / "hf", f"_{name}")
        finally:
            del FAMILY_SHAPES[f"_{name}"]
    return out


@pytest.mark.parametrize("name", list(WINDOWED))
def test_each_layer_keeps_its_own_window(windowed, name):
    c = gptconv.open_source(windowed[name]).config
    expected = {"qwen2": [None, 12], "qwen3": [12, None, 12]}[name]
    assert [c.window(i) for i in range(c.n_layers)] == expected
    ids = random_ids(c.vocab_size, c.context_length)  # 96 positions: 8× the window
    with torch.no_grad():
        assert_fp32_parity(gptconv.load(windowed[name])(ids), hf_model(windowed[name])(ids).logits, name)


@pytest.mark.parametrize("name", list(WINDOWED))
def test_generation_verify_and_hf_export(windowed, tmp_path, name):
    assert_generation_matches(windowed[name])
    hf_round_trip(windowed[name], tmp_path / "out")
    report = gptconv.verify(str(windowed[name]))
    print(f"\n{name} some layers sliding: verify vs transformers max|Δ| = {report.max_abs_diff:.3e} "
          f"at {report.inputs['random']} positions")
    assert report.passed and report.inputs["random"] > 12


def test_the_cache_keeps_a_window_only_where_the_layer_has_one(windowed):
    model = gptconv.load(windowed["qwen3"])
    cache = KVCache.for_model(model, batch=1, max_len=96)
    assert [slot.window for slot in cache.layers] == [12, None, 12]


def test_gguf_export_refuses_in_one_line(windowed, tmp_path):
    r = run_cli("export", windowed["qwen3"], "--format", "gguf", "-o", tmp_path / "m.gguf")
    assert r.returncode != 0 and "has no sliding window" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.gguf").exists()
