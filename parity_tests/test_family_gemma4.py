"""Gemma 4, E2B-like (gemma4_text): per-layer embeddings (8 per layer), the last 2 of 6 layers sharing the keys
and values of earlier ones with double-wide MLPs, local layers (heads of 16, window 16) and global ones (heads of
32 with proportional RoPE on a quarter of their frequencies), w-scaled norms, a scalar per layer, soft-capped
logits. ``family_battery.py`` runs the checks every family passes, past the window. The 31B-like (keys as
values) and 26B-A4B-like (the MoE block) checkpoints: ``test_family_gemma4_31b.py``, ``…_26b.py``."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from gptconv.layers import gemma4
from gptconv.layers.kv_cache import KVCache, SharedKV

ARCH = "gemma4_text"
VOCAB = "llama-spm-bpe"  # llama.cpp's Llama 2 vocabulary as a byte-fallback BPE tokenizer.json, as Gemma 4 ships
LAYERS = ["sliding_attention", "sliding_attention", "full_attention"] * 2
SHAPE = dict(vocab_size=32000, max_position_embeddings=64, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
             layer_types=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
             sliding_window=16, final_logit_softcapping=30.0, hidden_size_per_layer_input=8,
             vocab_size_per_layer_input=32000, num_kv_shared_layers=3, use_double_wide_mlp=True,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
# (llama.cpp needs the layer before the shared ones global and the one before it local, as in the E2B)
STEPS = ["per_layer_embedding", "block.0.per_layer_input", "KV sharing: the last 3 layers", "3←1, 4←1, 5←2",
         "8 of them rotated: proportional RoPE"]
# the card's "2.3B effective": ours without the per-layer table (262,144 × 35 × 256) is 2,279,759,139; the E4B's
# without its table (262,144 × 42 × 256) 4,644,441,130
PRESETS = {"gemma-4-e2b": 4_628_569_379, "gemma-4-e4b": 7_463_013_418}
FLOAT64_BOUND = True  # transformers' own float32 is 1.8e-4 from its float64 here (ours 1.6e-4)


def test_shared_layers_hold_no_keys_and_refer_to_their_source(ckpt):
    """Layers 3, 4 (local) and 5 (global) attend to layer 1's and 2's keys and values: no k or v of their own, a
    cache slot that stores nothing and refers to the source's, an MLP twice as wide."""
    model = gptconv.load(ckpt)
    c = model.config
    assert [c.kv_source(i) for i in range(6)] == [None, None, None, 1, 1, 2]
    assert model.blocks[3].attn.k is None and model.blocks[5].attn.v is None and model.blocks[2].attn.k is not None
    assert model.blocks[3].mlp.gate.out_features == 2 * model.blocks[2].mlp.gate.out_features
    cache = KVCache.for_model(model, batch=1, max_len=64)
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7, 8]]), cache=cache)
    assert isinstance(cache.layers[5], SharedKV) and cache.layers[5].of is cache.layers[2]
    assert cache.layers[4].nbytes == 0 and cache.layers[4].of is cache.layers[1] and cache.layers[1].nbytes > 0


@pytest.mark.parametrize("fault", ["partial rotary", "scalar left out", "no value norm"])
def test_planted_faults_fail_verify(ckpt, monkeypatch, fault):
    """Each of Gemma 4's own steps, done another way, is caught: global RoPE over the first quarter of each
    head's dimensions (NeoX partial rotary) instead of a quarter of its frequencies; the layer scalar left out;
    V not normed."""
    if fault == "partial rotary":
        real = gemma4.Gemma4.inv_freq

        def inv_freq(self, kind, device):
            freqs = real(self, kind, device)
            if kind == "full_attention":  # the rotated quarter's own frequencies, over a quarter of the head
                c = self.config
                r = int(c.global_rope_fraction * c.global_head_dim // 2)
                freqs = torch.cat([gemma4.rope_frequencies(2 * r, c.rope_theta), torch.zeros(freqs.numel() - r)])
            return freqs
        monkeypatch.setattr(gemma4.Gemma4, "inv_freq", inv_freq)
    elif fault == "scalar left out":
        real_forward = gemma4.Block.forward
        monkeypatch.setattr(gemma4.Block, "forward", lambda self, x, step, shared, per_layer: real_forward(
            self, x, step, shared, per_layer) / self.layer_scalar)
    else:
        monkeypatch.setattr(gemma4, "plain_rms_norm", lambda x, eps: x)
    report = gptconv.verify(str(ckpt), length=40)
    assert not report.passed, fault


def test_the_gap_to_llama_cpp_is_its_float16_gelu(ours_gguf):
    """llama.cpp's CPU GELU reads a float16 table (input and output rounded to float16). Ours with that rounding
    comes several times closer to llama.cpp than ours as is: the gap its tolerance allows for is that table."""
    import torch.nn.functional as F

    from gptconv.layers import mlp
    from gptconv.llamacpp import LlamaCpp
    model = gptconv.load(ours_gguf)
    ids = torch.randint(3, 32000, (1, 64), generator=torch.Generator().manual_seed(0))
    with LlamaCpp(ours_gguf, 64) as llm:
        theirs = torch.from_numpy(llm.logits(ids[0].tolist()))
    real = F.gelu

    def ggml_gelu(x, approximate="none"):
        return real(x.half().float(), approximate=approximate).half().to(x.dtype)
    with torch.no_grad():
        plain = (model(ids)[0] - theirs).abs().max().item()
        mlp.F.gelu = gemma4.F.gelu = ggml_gelu
        try:
            emulated = (model(ids)[0] - theirs).abs().max().item()
        finally:
            mlp.F.gelu = gemma4.F.gelu = real
    print(f"\nE2B-like vs llama.cpp: max|Δ| {plain:.2e}, with ggml's GELU {emulated:.2e}")
    assert emulated * 4 < plain


def test_a_window_misstated_in_the_file_is_beyond_the_llama_cpp_tolerance(ckpt, ours_gguf, tmp_path, monkeypatch):
    """The tolerance for llama.cpp's float16 GELU still catches a wrong file: llama.cpp running a GGUF whose
    window is halved, against our model of the folder, is far outside it; running ours, inside."""
    from dataclasses import replace

    from gptconv.families import gemma4 as family
    from gptconv.llamacpp import LlamaCpp
    from gptconv.parity.compare import LLAMA_CPP
    from gptconv.writers import export, gguf_file
    real = family.FAMILY.gguf_metadata
    planted = replace(family.FAMILY, gguf_metadata=lambda w, c: real(w, replace(c, sliding_window=8)))
    monkeypatch.setattr(gguf_file, "family_of", lambda config: planted)
    halved = export(str(ckpt), tmp_path / "halved.gguf", "gguf", "f32").out
    monkeypatch.undo()
    ids = torch.randint(3, 32000, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = gptconv.load(ckpt)(ids)[0]
    tol = LLAMA_CPP["gemma4"]
    allowed = tol.atol + tol.rtol * ours.abs().max().item()
    for path, inside in ((ours_gguf, True), (halved, False)):
        with LlamaCpp(path, 64) as llm:
            gap = (ours - torch.from_numpy(llm.logits(ids[0].tolist()))).abs().max().item()
        assert (gap <= allowed) == inside, (path.name, gap, allowed)


def test_transformers_cannot_read_our_gemma4_gguf_said_in_one_line(ours_gguf):
    """transformers 5.25's GGUF reader makes gemma4's per-layer lists into configs it then refuses, and given a
    config leaves the layer scalars unread: verify against it says so in one line (llama.cpp is the reference)."""
    from helpers import run_cli
    r = run_cli("verify", ours_gguf)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "transformers cannot read this GGUF file" in r.stderr and "--against llama.cpp" in r.stderr
