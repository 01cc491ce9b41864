"""The shared parts of the hybrid decoders (``gptconv/layers/linear_attention.py``, ``layers/conv.py``, the
recurrent slot of ``layers/kv_cache.py``): the gated delta rule's two forms against each other and against
transformers' torch forms, padding that must not reach the state, and the state's size."""

from __future__ import annotations

import pytest
import torch

import gptconv
from gptconv.layers import linear_attention
from gptconv.layers.linear_attention import DeltaNetShape, chunked_delta_rule, l2_normalize, recurrent_delta_rule
from gptconv.models import KVCache, PRESETS
from helpers import assert_left_padding_kept_out, random_ids


def rule_inputs(dtype, B=2, H=3, T=150, dk=16, dv=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    return dict(q=l2_normalize(r(B, H, T, dk)) * dk ** -0.5, k=l2_normalize(r(B, H, T, dk)), v=r(B, H, T, dv),
                g=-torch.rand(B, H, T, generator=g, dtype=dtype) * 2, beta=torch.rand(B, H, T, generator=g, dtype=dtype),
                state=r(B, H, dk, dv))


@pytest.mark.parametrize("chunk", [1, 7, 64, 200])
def test_the_chunked_rule_equals_the_recurrent_one(chunk):
    """In float64, from a non-zero state, over chunk boundaries and a last partial chunk: equal to rounding."""
    x = rule_inputs(torch.float64)
    (o1, s1), (o2, s2) = chunked_delta_rule(**x, chunk=chunk), recurrent_delta_rule(**x)
    assert (o1 - o2).abs().max() < 1e-12 and (s1 - s2).abs().max() < 1e-12


def test_both_forms_equal_transformers_torch_forms():
    """transformers' torch fallbacks (not its optional CUDA kernels), on the same unnormalised q and k:
    outputs and final state within float32 rounding (both run in float32)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import (torch_chunk_gated_delta_rule,
                                                               torch_recurrent_gated_delta_rule)
    g = torch.Generator().manual_seed(2)
    B, T, H, dk, dv = 2, 150, 4, 16, 24
    q, k = torch.randn(B, T, H, dk, generator=g), torch.randn(B, T, H, dk, generator=g)
    v, state = torch.randn(B, T, H, dv, generator=g), torch.randn(B, H, dk, dv, generator=g)
    decay, beta = -torch.rand(B, T, H, generator=g) * 2, torch.rand(B, T, H, generator=g)
    ours_in = dict(q=l2_normalize(q.transpose(1, 2)) * dk ** -0.5, k=l2_normalize(k.transpose(1, 2)),
                   v=v.transpose(1, 2), g=decay.transpose(1, 2), beta=beta.transpose(1, 2), state=state)
    for ours, theirs in ((chunked_delta_rule, torch_chunk_gated_delta_rule),
                         (recurrent_delta_rule, torch_recurrent_gated_delta_rule)):
        o, s = ours(**ours_in)
        o_ref, s_ref = theirs(q, k, v, decay, beta, initial_state=state, output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
        print(f"\n{ours.__name__}: max|Δ| output {(o.transpose(1, 2) - o_ref).abs().max():.2e}, "
              f"state {(s - s_ref).abs().max():.2e} (max|state| {s_ref.abs().max():.1f})")
        assert (o.transpose(1, 2) - o_ref).abs().max() < 2e-6 and (s - s_ref).abs().max() < 2e-6  # 16 ulps of 1


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A tiny Qwen3.5 without a tokenizer: 4 layers, 3 of them linear attention."""
    import transformers
    folder = tmp_path_factory.mktemp("qwen3_5") / "hf"
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "qwen3_5_text", vocab_size=400, max_position_embeddings=160, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=96, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24, initializer_range=0.2)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def test_left_padding_does_not_reach_the_state(hybrid, monkeypatch):
    """Prompts of different lengths, left-padded into one batch: each generates what it does alone. The test
    can fail: with pads let into the linear layers' state (their input not zeroed, their decay applied), it does."""
    assert_left_padding_kept_out(monkeypatch, hybrid, linear_attention.GatedDeltaNet, [7, 40, 23], 24, pad_id=5)


def test_the_recurrent_state_does_not_grow_with_the_sequence(hybrid):
    """After 10 and after 150 positions the linear layers' slots hold the same bytes; the attention layer's
    grows. Printed: what one sequence's state costs in Qwen3.5-0.8B."""
    model = gptconv.load(hybrid)
    sizes = {}
    for n in (10, 150):
        cache = KVCache.for_model(model, batch=1, max_len=160, reserve=n)
        with torch.no_grad():
            model(random_ids(400, n, batch=1), cache=cache)
        sizes[n] = [slot.nbytes for slot in cache.layers]
    assert sizes[10][:3] == sizes[150][:3] and sizes[150][3] > sizes[10][3]
    c = PRESETS["qwen3.5-0.8b"]
    linear = sum(c.linear_at(i) for i in range(c.n_layers))
    state = linear * c.linear_attention.state_bytes(torch.bfloat16)
    per_token = 2 * (c.n_layers - linear) * c.n_kv_heads * c.head_dim * 2
    print(f"\nQwen3.5-0.8B in bfloat16: {linear} linear layers hold {state:,} bytes per sequence at any length; "
          f"its {c.n_layers - linear} attention layers {per_token:,} bytes per token (a full-attention model of "
          f"24 such layers: {per_token * c.n_layers // (c.n_layers - linear):,})")
    assert c.linear_attention == DeltaNetShape(16, 16, 128, 128, 4)


def test_value_heads_wider_than_key_heads_match_transformers(hybrid):
    """Value heads of 24 under key heads of 16 (llama.cpp's qwen35 has them equal, so the family tests do): ours
    is as close to transformers' float64 as its float32 is, over 150 positions."""
    from helpers import hf_model
    model = gptconv.load(hybrid)
    assert model.config.linear_attention.v_dim == 24 and model.config.linear_attention.k_dim == 16
    ids = random_ids(400, 150)
    with torch.no_grad():
        mine, ref, truth = model(ids), hf_model(hybrid)(ids).logits, hf_model(hybrid, torch.float64)(ids).logits
    rms = lambda x: x.double().pow(2).mean().sqrt().item()  # noqa: E731
    assert rms(mine - truth) <= 2 * rms(ref - truth) and torch.equal(mine.argmax(-1), ref.argmax(-1))
