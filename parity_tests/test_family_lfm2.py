"""LFM2: six layers, four of them gated short convolutions (3 taps) and two attention layers with per-head q/k
norms, the MLP's size adjusted as transformers does (200 → ⅔ → 133 → rounded up to 32: 160), the final norm
under HF's name embedding_norm; ``family_battery.py`` runs the checks every family passes (generation
through the conv layers' state included) against llama.cpp's lfm2 too."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from fixtures import make_checkpoint
from gptconv.decoding import generate_ids
from gptconv.errors import GptconvError
from gptconv.layers import short_conv
from gptconv.models import KVCache
from gptconv.writers import export
from helpers import assert_left_padding_kept_out, hf_model, random_ids

ARCH = "lfm2"
VOCAB = "gpt-2"  # LFM2's own has 65,536 tokens (llama.cpp's pre-tokenizer lfm2); the converter reads GPT-2's as BPE
SHAPE = dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=200, block_multiple_of=32, conv_L_cache=3,
             layer_types=["conv", "conv", "full_attention", "conv", "full_attention", "conv"],
             bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
STEPS = ["block.0.short_conv", "block.2.q_norm",
         "mixing positions: attention in layers 2, 4; a gated short convolution",
         "in 4 layers (0, 1, 3, 5): each keeps its last 2 inputs"]
# LiquidAI/LFM2-350M: 354,483,968 counted on meta (the Hub lists 354M)
PRESETS = {"lfm2-350m": 354_483_968}


def test_the_layers_and_the_mlp_size_are_transformers(ckpt):
    c = gptconv.open_source(ckpt).config
    assert [c.conv_at(i) for i in range(6)] == [True, True, False, True, False, True]
    assert c.d_ff == 160 and c.short_conv == short_conv.ShortConvShape(3) and c.attention.qk_norm
    assert hf_model(ckpt).model.layers[0].feed_forward.w1.out_features == 160


def test_b_and_c_swapped_fail_verify_at_the_first_conv_layer(ckpt, monkeypatch):
    """A planted fault: the gates read in the wrong order (C before the convolution, B after). verify finds it
    in block 0, the first conv layer."""
    real = short_conv.ShortConv.forward

    def swapped(self, x, step):
        w = self.in_bcx.weight.data
        b, c, h = w.chunk(3)
        self.in_bcx.weight.data = torch.cat([c, b, h])
        try:
            return real(self, x, step)
        finally:
            self.in_bcx.weight.data = w
    monkeypatch.setattr(short_conv.ShortConv, "forward", swapped)
    report = gptconv.verify(str(ckpt), length=24)
    assert not report.passed and report.first_divergent_step == "block.0", report.first_divergent_step


def test_a_conv_state_one_position_late_fails_generation(ckpt, monkeypatch):
    """A planted fault: the cached window keeps the inputs one position too early (the last but one taken
    for the last). Prefill is right, so only the cached generation can show it, and it does."""
    from gptconv.layers import conv
    model = gptconv.load(ckpt)
    prompt = random_ids(model.config.vocab_size, 6, batch=1, seed=5)[0].tolist()
    right = generate_ids(model, prompt, 20)
    real = conv.CausalConv.forward

    def late(self, x, slot=None):
        past = slot.conv if slot is not None else None
        y = real(self, x, slot)
        if slot is not None:
            seq = torch.cat([past, x.transpose(1, 2)], dim=2)             # what the window has seen
            slot.conv = seq[:, :, seq.size(2) - past.size(2) - 1:-1]       # its last inputs but the newest
        return y
    monkeypatch.setattr(conv.CausalConv, "forward", late)
    assert generate_ids(model, prompt, 20) != right


def test_left_padding_does_not_reach_the_conv_state(ckpt, monkeypatch):
    """Prompts of different lengths, left-padded into one batch: each generates what it does alone. The test
    can fail: with the pads let into the convolution's window, it does."""
    assert_left_padding_kept_out(monkeypatch, ckpt, short_conv.ShortConv, [5, 30, 17], 20, pad_id=7)


def test_the_conv_state_does_not_grow(ckpt):
    """After 8 and after 60 positions the conv layers' slots hold the same bytes (2 inputs of 64 channels)."""
    model = gptconv.load(ckpt)
    sizes = {}
    for n in (8, 60):
        cache = KVCache.for_model(model, batch=1, max_len=64, reserve=n)
        with torch.no_grad():
            model(random_ids(model.config.vocab_size, n, batch=1), cache=cache)
        sizes[n] = [slot.nbytes for slot in cache.layers]
    conv = [i for i in range(6) if model.config.conv_at(i)]
    assert all(sizes[8][i] == sizes[60][i] == 64 * 2 * 4 for i in conv)
    assert all(sizes[60][i] > sizes[8][i] for i in range(6) if i not in conv)


def test_conv_biases_match_transformers_and_are_not_exported_to_gguf(tmp_path):
    """conv_bias: biases on in_proj, the convolution and out_proj, as transformers has them; llama.cpp's lfm2
    has none."""
    folder = make_checkpoint(tmp_path / "hf", ARCH, VOCAB, {**SHAPE, "conv_bias": True})
    ours = gptconv.load(folder)
    assert ours.blocks[0].attn.conv.bias is not None and ours.blocks[0].attn.in_bcx.bias is not None
    ids = random_ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        assert (ours(ids) - hf_model(folder)(ids).logits).abs().max() < 1e-4
    with pytest.raises(GptconvError, match="llama.cpp's lfm2 has no biases on its conv layers; not exported"):
        export(str(folder), tmp_path / "m.gguf", "gguf", "f32")


def test_full_attn_idxs_and_the_legacy_names_read_as_transformers(tmp_path):
    """Older configs: full_attn_idxs for layer_types, block_ff_dim for intermediate_size."""
    from transformers import AutoConfig

    from gptconv.families.lfm2 import config_from_hf
    data = {k: v for k, v in SHAPE.items() if k != "layer_types"}
    data.update(full_attn_idxs=[1, 4], block_ff_dim=300, intermediate_size=999)
    ours = config_from_hf(data, "config.json")
    theirs = AutoConfig.for_model(ARCH, **data)
    assert [FULL_OR_CONV[ours.conv_at(i)] for i in range(6)] == theirs.layer_types
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP
    assert ours.d_ff == Lfm2MLP(theirs).w1.out_features == 224
    with pytest.raises(GptconvError, match="layer_types must give full_attention or conv"):
        config_from_hf({**SHAPE, "layer_types": ["sliding_attention"] * 6}, "config.json")


FULL_OR_CONV = {True: "conv", False: "full_attention"}
