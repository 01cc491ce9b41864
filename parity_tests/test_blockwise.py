"""Streamed verify: both models run one block at a time, with the same numbers as the whole models."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gptconv
from gptconv import verify
from gptconv.families import family_of
from gptconv.loader import load_source, open_source
from gptconv.parity.hf_reference import (gguf_transformers_model, load_transformers_model, reference_steps,
                                         transformers_model)
from gptconv.streaming import Rows
from helpers import random_ids, run_cli


def _without_source(report) -> dict:
    d = dataclasses.asdict(report)
    d.pop("reference")
    d.pop("seconds")  # where the time went, which changes from run to run
    return d


@pytest.mark.parametrize("fixture,name", [("ckpts", "odd"), ("llamas", "llama3-gqa"), ("llamas", "tied"),
                                          ("llamas", "qwen2"), ("llamas", "llama31-scaled")])
def test_streamed_verify_reports_what_the_whole_models_report(request, fixture, name):
    folder = request.getfixturevalue(fixture)[name]
    whole = verify(str(folder), blockwise=False)
    streamed = verify(str(folder), blockwise=True)
    assert whole.passed and streamed.passed
    assert "blockwise" in streamed.reference and "blockwise" not in whole.reference
    assert _without_source(streamed) == _without_source(whole)  # bit for bit: the same weights, the same ops


def test_only_one_block_is_in_memory_at_a_time(llamas):
    src = open_source(llamas["llama2-mha"], backend="per-tensor")
    ours, ref = load_source(src, blockwise=True), transformers_model(src, blockwise=True)
    seen = []
    for model, blocks in ((ours, ours.blocks), (ref, ref.model.layers)):
        def check(module, _args, blocks=blocks):
            seen.append([next(b.parameters()).is_meta for b in blocks])
        for b in blocks:
            b.register_forward_pre_hook(check, prepend=False)
        with torch.no_grad():
            model(random_ids(src.config.vocab_size, 16))
        assert all(next(b.parameters()).is_meta for b in blocks)  # all dropped again after the forward
        # and the tables are never whole: read by rows as they are used
        assert all(isinstance(p, Rows) for n, p in model.named_parameters() if "emb" in n or "head" in n)
    # at each block's start: its own weights present, every other block's absent
    assert seen == [[False, True], [True, False], [False, True], [True, False]]
    with torch.no_grad():  # and the outputs are the whole models' outputs
        ids = random_ids(src.config.vocab_size, 16)
        torch.testing.assert_close(ours(ids), gptconv.load(llamas["llama2-mha"])(ids), rtol=0, atol=0)
        whole = load_transformers_model(llamas["llama2-mha"])
        taps = family_of(src.config).hf_steps
        torch.testing.assert_close(reference_steps(ref, taps, 2, ids)["logits"],
                                   reference_steps(whole, taps, 2, ids)["logits"], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["llama3-gqa", "tied", "qwen2"])
def test_a_streamed_gguf_reference_is_transformers_own_reading(llamas, tmp_path, name):
    """From a GGUF file, the reference is filled a block at a time by transformers' GGUF functions (its name
    map, gguf's dequantization, its tensor processor: the Q/K permutation undone); its model equals the one
    its loader (from_pretrained) builds from the whole file, bit for bit, and a streamed verify passes."""
    gguf = gptconv.export(str(llamas[name]), tmp_path / "m.gguf", "gguf", "q8_0").out
    src = open_source(gguf)
    ref = transformers_model(src)
    whole = gguf_transformers_model(src)
    ids = random_ids(src.config.vocab_size, 16)
    taps = family_of(src.config).hf_steps
    n = src.config.n_layers
    torch.testing.assert_close(reference_steps(ref, taps, n, ids)["logits"],
                               reference_steps(whole, taps, n, ids)["logits"], rtol=0, atol=0)
    assert verify(str(gguf), blockwise=True).passed


def test_names_transformers_does_not_use_are_read_by_its_loader(ckpts):
    """GPT-2's original keys (without 'transformer.'): transformers' own loader renames them, block by block too."""
    src = open_source(ckpts["tiny-legacy"], backend="per-tensor")
    streamed = transformers_model(src, blockwise=True)
    ids = random_ids(src.config.vocab_size, 16)
    taps = family_of(src.config).hf_steps
    with torch.no_grad():
        torch.testing.assert_close(reference_steps(streamed, taps, 2, ids)["logits"],
                                   reference_steps(load_transformers_model(ckpts["tiny-legacy"]), taps, 2, ids)["logits"],
                                   rtol=0, atol=0)


@pytest.mark.parametrize("fixture,name,ours_name,theirs_name", [
    ("llamas", "llama3-gqa", "blocks.0.attn.q.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("llamas", "llama31-scaled", "blocks.1.mlp.down.weight", "model.layers.1.mlp.down_proj.weight"),
    ("llamas", "qwen2", "blocks.0.attn.k.bias", "model.layers.0.self_attn.k_proj.bias"),
    ("ckpts", "tiny", "blocks.0.attn.qkv.weight", "transformer.h.0.attn.c_attn.weight")])
def test_the_whole_reference_shares_our_weights(request, fixture, name, ours_name, theirs_name):
    """verify without streaming: from an fp32 HF folder, transformers' model (filled by its own loader) and
    ours hold the same memory-mapped tensors (the weights in memory once), and it computes what
    from_pretrained's does; its tables are read by rows from the same mapping."""
    folder = request.getfixturevalue(fixture)[name]
    src = open_source(folder)
    ours, ref = load_source(src), transformers_model(src)
    mine, theirs = ours.get_parameter(ours_name), ref.get_parameter(theirs_name)
    assert mine.untyped_storage().data_ptr() == theirs.untyped_storage().data_ptr()
    for p in ref.parameters():
        assert not p.is_meta or isinstance(p, Rows)
    ids = random_ids(src.config.vocab_size, 16)
    taps, n = family_of(src.config).hf_steps, src.config.n_layers
    torch.testing.assert_close(reference_steps(ref, taps, n, ids)["logits"],
                               reference_steps(load_transformers_model(folder), taps, n, ids)["logits"], rtol=0, atol=0)


def test_a_legacy_folder_verifies(ckpts):
    src = open_source(ckpts["tiny-legacy"])  # GPT-2's original keys: transformers' loader renames them
    ref = transformers_model(src)
    assert not any(p.is_meta and not isinstance(p, Rows) for p in ref.parameters())
    assert verify(str(ckpts["tiny-legacy"])).passed
