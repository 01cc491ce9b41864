"""Phi-4-mini (HF phi3; GGUF phi3): RoPE on the first 3/4 of each head (partial rotary) and longrope, short
factors while a forward reaches no further than the original context (32 here), long ones past it; a tied
head and a GPT-2 tokenizer (llama.cpp's converter reads a phi3 folder whose tokenizer_class is GPT2Tokenizer
as BPE). ``family_battery.py`` runs the checks every family passes; generation runs to 96 positions, past
the switch to the long factors.

llama.cpp picks the factors once, by its context size (long whenever it exceeds the original), and pads
every context to a multiple of 256; transformers and we pick them per forward call, by how far it reaches.
The two agree where both use the same factors: the battery's llama.cpp check runs a checkpoint whose
original context (256) no context of verify's exceeds (short factors on both sides), and the tests below
compare the fixture's file on a forward past the original context (long factors on both sides) and show
the difference on a short one."""

from __future__ import annotations

import dataclasses

import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from gptconv.layers.kv_cache import KVCache
from gptconv.llamacpp import LlamaCpp
from gptconv.parity.compare import LLAMA_CPP
from helpers import hf_model, random_ids

ARCH = "phi3"
VOCAB = "gpt-2"
# 6 frequencies rotated of 8 (rope dim 12 of head_dim 16); the long factors far from the short ones
_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
         "short_factor": [1.0, 1.02, 1.05, 1.1, 1.2, 1.3], "long_factor": [1.0, 1.5, 2.5, 4.0, 8.0, 16.0]}
SHAPE = dict(vocab_size=50257, max_position_embeddings=96, original_max_position_embeddings=32, hidden_size=64,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
             partial_rotary_factor=0.75, rope_parameters=_ROPE, tie_word_embeddings=True, sliding_window=None,
             bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
STEPS = ["partial rotary: RoPE on the first 12 of 16 dimensions", "longrope: long factors past 32 positions",
         "longrope scaling"]
# Phi-4-mini-instruct: 3,836,021,760 (the Hub's safetensors parameter count; the card's "3.8B")
PRESETS = {"phi-4-mini": 3_836_021_760}
KNOWN = {}
# an original context no llama.cpp context of verify's (padded to 256) exceeds: short factors on both sides
LLAMA_CPP_CHANGES = dict(max_position_embeddings=512, original_max_position_embeddings=256)
LLAMA_CPP_LENGTH = 96


def test_the_config_is_read_as_transformers_reads_it(ckpt):
    c = gptconv.open_source(ckpt).config
    s = c.rope.scaling
    assert c.rope.dim == 12 and c.head_dim == 16 and c.tie_embeddings and c.attention.window is None
    assert s.kind == "longrope" and s.original_context_length == 32 and s.factor == 3.0
    assert abs(s.attention_factor - (1 + torch.log(torch.tensor(3.0)) / torch.log(torch.tensor(32.0))).sqrt()) < 1e-6


def test_the_long_factors_apply_to_a_forward_past_the_original_context(ckpt):
    """Per forward call, as transformers: the first 32 positions' logits of a 33-position forward (long
    factors) differ from those of a 32-position one (short); each equals transformers'."""
    ours, theirs = gptconv.load(ckpt), hf_model(ckpt)
    ids = random_ids(ours.config.vocab_size, 33)
    with torch.no_grad():
        long, short = ours(ids)[:, :32], ours(ids[:, :32])
        assert (long - theirs(ids).logits[:, :32]).abs().max() < 1e-4
        assert (short - theirs(ids[:, :32]).logits).abs().max() < 1e-4
        assert (long - short).abs().max() > 1e-2


def test_llama_cpp_runs_long_factors_whatever_the_forward_reaches(ours_gguf):
    """llama.cpp's context (96, padded to 256) exceeds the original 32: long factors for every forward. On
    96 positions it equals ours (long factors too); on the first 16 alone it equals our first 16 of
    that forward, not our own 16-position forward (short factors)."""
    ours = gptconv.load(ours_gguf)
    ids = random_ids(ours.config.vocab_size, 96)
    tol = LLAMA_CPP["llama"]
    with LlamaCpp(ours_gguf, 96) as llm, torch.no_grad():
        full, head = torch.from_numpy(llm.logits(ids[0].tolist())), torch.from_numpy(llm.logits(ids[0, :16].tolist()))
        mine = ours(ids)[0]
        d = (full - mine).abs().max().item()
        print(f"\nphi4-mini: our GGUF vs llama.cpp, 96 positions (long factors): max|Δ| = {d:.3e}")
        assert d <= tol.atol + tol.rtol * mine.abs().max().item()
        assert (head - mine[:16]).abs().max().item() <= tol.atol + tol.rtol * mine.abs().max().item()
        assert (head - ours(ids[:, :16])[0]).abs().max().item() > 1e-2


def test_partial_rotary_read_as_full_fails_verify(ckpt, monkeypatch):
    """A planted fault: every dimension of each head rotated (rope_dim dropped), with factors for them."""
    from gptconv.layers.decoder import DecoderConfig
    from gptconv.layers.rope import RopeScaling
    real = DecoderConfig.__post_init__

    def full(self):
        s = self.rope.scaling
        if self.rope.dim and s is not None:
            pad = (1.0,) * (((self.head_dim or self.d_model // self.n_heads) - self.rope.dim) // 2)
            object.__setattr__(self, "rope", dataclasses.replace(self.rope, dim=0, scaling=RopeScaling(
                "longrope", factor=s.factor, original_context_length=s.original_context_length,
                factors=s.factors + pad, long_factors=s.long_factors + pad, attention_factor=s.attention_factor)))
        real(self)
    monkeypatch.setattr(DecoderConfig, "__post_init__", full)
    report = gptconv.verify(str(ckpt), length=48)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step


def test_short_factors_past_the_original_context_fail_verify(ckpt, monkeypatch):
    """A planted fault: the short factors kept past the original context."""
    from gptconv.layers import decoder
    real = decoder.Decoder.inv_freq
    monkeypatch.setattr(decoder.Decoder, "inv_freq", lambda self, device, long=False, local=False:
                        real(self, device, False, local))
    report = gptconv.verify(str(ckpt), length=48)
    assert not report.passed and report.first_divergent_step.startswith("block.0"), report.first_divergent_step



def test_generation_recomputes_the_cache_once_past_the_original_context(ckpt, monkeypatch):
    """The battery's generation check runs to 96 past the switch at 32, where the cached keys (rotated with
    the short factors) are recomputed, as transformers' phi3 does in generate. Without that recompute (a
    planted fault) the keys of the first 32 positions keep the short factors: the logits past 32 differ
    from the recomputed sequence's. A batch of two prompts of one length generates as each alone (of
    different lengths they cannot: the longest row's reach picks the factors for the batch, in transformers
    too)."""
    from gptconv.decoding import generate_batch, generate_ids
    model = gptconv.load(ckpt)
    prompts = [random_ids(model.config.vocab_size, n, batch=1, seed=n)[0].tolist() for n in (6, 7)][:1]
    prompts.append(random_ids(model.config.vocab_size, 6, batch=1, seed=11)[0].tolist())
    alone = [generate_ids(model, p, 90) for p in prompts]
    assert generate_batch(model, prompts, 90) == alone
    monkeypatch.setattr(type(model), "cache_stale", lambda self, cached, reach: False)
    assert generate_ids(model, prompts[0], 90) != alone[0]
    ids = prompts[0] + alone[0]
    with torch.no_grad():
        recomputed = model(torch.tensor([ids]))[0, 32:48]
        cache = KVCache.for_model(model, 1, 96)
        model(torch.tensor([ids[:32]]), cache=cache)
        stepped = torch.cat([model(torch.tensor([[t]]), cache=cache)[0] for t in ids[32:48]])
    assert (stepped - recomputed).abs().max() > 1e-2
