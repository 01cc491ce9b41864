"""Our GPT-2 against transformers' GPT2LMHeadModel: logits at full context, and generation."""

from __future__ import annotations

import pytest
import torch

import gptconv
from gptconv.parity.compare import FP32, SAME_MODEL
from gptconv.decoding import generate_ids as generate
from helpers import hf_model, random_ids


FIXTURES = ["tiny", "odd", "tiny-sharded", "tiny-bin", "tiny-legacy"]


def logits_diff(folder, batch: int = 2) -> tuple[float, float]:
    ours = gptconv.load(folder)
    ref = hf_model(folder)
    ids = random_ids(ours.config.vocab_size, ours.config.context_length, batch)  # the full context
    with torch.no_grad():
        a, b = ours(ids), ref(ids).logits
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return (a - b).abs().max().item(), top1


@pytest.mark.parametrize("name", FIXTURES)
def test_logits_match_transformers_at_full_context(ckpts, name):
    diff, top1 = logits_diff(ckpts[name])
    print(f"\n{name}: fp32 max|Δ| = {diff:.3e}, top-1 = {top1:.2%}")
    assert diff <= FP32.atol
    assert top1 == 1.0


def test_full_size_gpt2_shape(gpt2_124m):
    diff, top1 = logits_diff(gpt2_124m, batch=1)
    print(f"\ngpt2-124m: fp32 max|Δ| = {diff:.3e}, top-1 = {top1:.2%}")
    assert diff <= FP32.atol
    assert top1 == 1.0


@pytest.mark.parametrize("name", ["tiny", "odd"])
def test_kv_cache_generation_equals_recompute_and_transformers(ckpts, name):
    model = gptconv.load(ckpts[name])
    prompt = random_ids(model.config.vocab_size, 5, batch=1, seed=3)[0].tolist()
    n = model.config.context_length - len(prompt)  # generate up to the last position
    cached = generate(model, prompt, n)

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):  # no cache: the whole sequence through the model at every step
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert cached == ids[len(prompt):]

    hf = hf_model(ckpts[name])
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                      eos_token_id=None)
    assert cached == out[0, len(prompt):].tolist()


def test_cached_chunks_equal_one_forward(ckpts):
    """Prefill in three chunks through the cache (T > 1 after a cached prefix) = one full forward."""
    model = gptconv.load(ckpts["odd"])
    ids = random_ids(model.config.vocab_size, model.config.context_length, batch=2)
    cache = gptconv.KVCache.for_model(model, batch=2, max_len=ids.shape[1])
    with torch.no_grad():
        full = model(ids)
        parts = [model(chunk, cache=cache) for chunk in ids.split([10, 1, 26], dim=1)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=SAME_MODEL.atol, rtol=SAME_MODEL.rtol)


def test_last_only_is_the_last_position(ckpts):
    model = gptconv.load(ckpts["tiny"])
    ids = random_ids(model.config.vocab_size, 20)
    with torch.no_grad():
        assert model(ids, last_only=True).shape == (2, 1, model.config.vocab_size)
        # same numbers up to BLAS blocking: the head sees one row instead of T
        torch.testing.assert_close(model(ids, last_only=True)[:, 0], model(ids)[:, -1], atol=SAME_MODEL.atol,
                                   rtol=SAME_MODEL.rtol)


def test_bf16_load_keeps_top1(ckpts):
    model = gptconv.load(ckpts["tiny"], dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    ref = gptconv.load(ckpts["tiny"])
    ids = random_ids(model.config.vocab_size, 64)
    with torch.no_grad():
        agree = (model(ids).float().argmax(-1) == ref(ids).argmax(-1)).float().mean().item()
    assert agree >= 0.9
