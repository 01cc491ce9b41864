"""Our Llama against transformers' LlamaForCausalLM / Qwen2ForCausalLM, random init at 0.2."""

from __future__ import annotations

import json

import pytest
import torch

import gptconv
from gptconv.errors import GptconvError
from helpers import hf_round_trip, assert_generation_matches, assert_fp32_parity, hf_model, random_ids

FIXTURES = ["llama2-mha", "llama3-gqa", "llama31-scaled", "linear-scaled", "tied", "head-dim", "biases", "qwen2",
            "llama31-legacy-config", "linear-legacy-config"]


@pytest.mark.parametrize("name", FIXTURES)
def test_logits_match_transformers_at_full_length(llamas, name):
    ours = gptconv.load(llamas[name])
    ref = hf_model(llamas[name])
    ids = random_ids(ours.config.vocab_size, ours.config.context_length)  # llama31-scaled: 256 ≫ 32 original
    with torch.no_grad():
        assert_fp32_parity(ours(ids), ref(ids).logits, name)


def test_fixtures_have_the_features_they_claim(llamas):
    cfg = {n: gptconv.open_source(llamas[n]).config for n in FIXTURES}
    assert cfg["llama2-mha"].n_kv_heads == cfg["llama2-mha"].n_heads
    gqa = cfg["llama3-gqa"]
    assert gqa.n_heads // gqa.n_kv_heads != gqa.n_kv_heads
    for name in ("llama31-scaled", "llama31-legacy-config"):
        s = cfg[name].rope.scaling
        assert s.kind == "llama3" and s.original_context_length * 8 == cfg[name].context_length
    assert cfg["linear-legacy-config"].rope.scaling.kind == "linear"
    assert cfg["tied"].tie_embeddings and not cfg["llama2-mha"].tie_embeddings
    assert cfg["head-dim"].head_dim * cfg["head-dim"].n_heads != cfg["head-dim"].d_model
    assert cfg["biases"].attention.qkv_bias and cfg["biases"].attention.o_bias and cfg["biases"].mlp.bias
    assert cfg["qwen2"].attention.qkv_bias and not cfg["qwen2"].attention.o_bias
    assert "rope_scaling" in json.loads((llamas["llama31-legacy-config"] / "config.json").read_text())


@pytest.mark.parametrize("name", ["llama3-gqa", "llama31-scaled", "tied", "qwen2"])
def test_kv_cache_generation_equals_recompute_and_transformers(llamas, name):
    assert_generation_matches(llamas[name])  # the scaled fixture runs past position 32


def _with_config(folder, tmp_path, **changes):
    import shutil
    dst = tmp_path / "changed"
    shutil.copytree(folder, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_unknown_rope_type_is_an_error(llamas, tmp_path):
    d = _with_config(llamas["llama2-mha"], tmp_path, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4,
                                                                     "factor": 2.0})
    with pytest.raises(GptconvError, match="rope_type 'dynamic' is not supported"):
        gptconv.open_source(d)


def test_yarn_matches_transformers_past_the_original_context(llamas, tmp_path):
    """YaRN (a shared RoPE part; OLMo 3's full layers use it): the same logits as transformers on positions
    past the original context, and transformers reads our HF export's YaRN back the same."""
    d = _with_config(llamas["llama2-mha"], tmp_path / "in", rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16})
    ours = gptconv.load(d)
    assert ours.config.rope.scaling.kind == "yarn" and ours.config.context_length > 32
    ids = torch.randint(0, ours.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(ids) - hf_model(d)(ids).logits).abs().max() < 1e-4
    hf_round_trip(d, tmp_path / "out")


def test_unsupported_activation_is_an_error(llamas, tmp_path):
    d = _with_config(llamas["llama2-mha"], tmp_path, hidden_act="gelu")
    with pytest.raises(GptconvError, match="hidden_act 'gelu' is not supported"):
        gptconv.open_source(d)
