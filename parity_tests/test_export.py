"""Export round trips, bit-exact in f32, and the safety of narrowing and overwriting."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import gptconv
from gptconv.writers import export
from gptconv.errors import GptconvError
from helpers import hf_round_trip, random_ids, run_cli
from gptconv.parity.compare import SAME_MODEL


@pytest.mark.parametrize("name", ["tiny", "odd"])
def test_gpt2_hf_round_trip_is_bit_exact(ckpts, tmp_path, name):
    hf_round_trip(ckpts[name], tmp_path / "out")
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied: stored once, as transformers stores it


@pytest.mark.parametrize("name", ["llama3-gqa", "llama31-scaled", "tied", "qwen2", "biases", "head-dim"])
def test_llama_hf_round_trip_is_bit_exact(llamas, tmp_path, name):
    hf_round_trip(llamas[name], tmp_path / "out")


def test_sharded_export_loads_in_transformers(llamas, tmp_path):
    out = tmp_path / "sharded"
    hf_round_trip(llamas["llama2-mha"], out, max_shard_bytes=100_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1


def test_gguf_source_exports_to_hf(smollm2, tmp_path):
    out = tmp_path / "smol-hf"
    export(str(smollm2), out, "safetensors", "f32")
    ours, back = gptconv.load(smollm2), gptconv.load(out)
    for (n, a), (_, b) in zip(ours.named_parameters(), back.named_parameters()):
        assert torch.equal(a, b), n
    tok = gptconv.load_tokenizer(out)
    assert tok.encode("The capital of France is") == gptconv.load_tokenizer(smollm2).encode("The capital of France is")


@pytest.mark.parametrize("name", ["llama2-mha", "llama3-gqa", "llama31-scaled", "tied", "qwen2"])
def test_hf_to_gguf_to_load_is_bit_exact(llamas, tmp_path, name):
    out = tmp_path / "m.gguf"
    export(str(llamas[name]), out, "gguf", "f32")
    a, b = gptconv.load(llamas[name]), gptconv.load(out)
    assert a.config.rope.theta == b.config.rope.theta and a.config.n_kv_heads == b.config.n_kv_heads
    for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), n
    ids = random_ids(a.config.vocab_size, a.config.context_length)
    with torch.no_grad():  # llama3 scaling comes back as per-frequency factors: the same angles
        torch.testing.assert_close(a(ids), b(ids), atol=SAME_MODEL.atol, rtol=SAME_MODEL.rtol)


def test_gpt2_to_gguf_to_load_is_bit_exact(ckpts, tmp_path):
    out = tmp_path / "g.gguf"
    export(str(ckpts["odd"]), out, "gguf", "f32")
    a, b = gptconv.load(ckpts["odd"]), gptconv.load(out)
    for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), n


def test_refuses_to_overwrite_without_force(ckpts, tmp_path):
    out = tmp_path / "x.gguf"
    out.write_bytes(b"precious")
    r = run_cli("export", ckpts["tiny"], "--format", "gguf", "-o", out)
    assert r.returncode == 2 and "already exists; pass --force" in r.stderr
    assert out.read_bytes() == b"precious"
    r = run_cli("export", ckpts["tiny"], "--format", "gguf", "-o", out, "--force")
    assert r.returncode == 0, r.stderr
    assert "sha256" in r.stdout and out.read_bytes()[:4] == b"GGUF"


def _planted(ckpts, tmp_path, value):
    import shutil

    from safetensors.torch import load_file, save_file
    d = tmp_path / "planted"
    shutil.copytree(ckpts["tiny"], d)
    state = load_file(d / "model.safetensors")
    state["transformer.h.1.mlp.c_fc.weight"][3, 7] = value
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_f16_overflow_fails_and_leaves_nothing(ckpts, tmp_path, fmt):
    src = _planted(ckpts, tmp_path, 1e6)
    out = tmp_path / "out"
    r = run_cli("export", src, "--format", fmt, "--dtype", "f16", "-o", out)
    assert r.returncode == 2
    assert "'transformer.h.1.mlp.c_fc.weight'" in r.stderr or "'blk.1.ffn_up.weight'" in r.stderr
    assert "65504" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.glob(".out*")) == []
    r = run_cli("export", src, "--format", fmt, "--dtype", "f16", "-o", out, "--clamp")
    assert r.returncode == 0, r.stderr


def test_nan_in_a_source_tensor_is_reported(ckpts, tmp_path):
    with pytest.raises(GptconvError, match="'transformer.h.1.mlp.c_fc.weight' holds NaN"):
        export(str(_planted(ckpts, tmp_path, float("nan"))), tmp_path / "o", "safetensors", "bf16")
    assert not (tmp_path / "o").exists()


def test_inspect_reads_what_export_writes(ckpts, tmp_path):
    out = tmp_path / "q.gguf"
    export(str(ckpts["tiny"]), out, "gguf", "q8_0")
    r = run_cli("inspect", out, "--json")
    assert r.returncode == 0, r.stderr
    tensors = {t["name"]: t for t in json.loads(r.stdout)["result"]["tensors"]}
    assert tensors["blk.0.ffn_up.weight"]["dtype"] == "Q8_0" and tensors["blk.0.attn_norm.weight"]["dtype"] == "F32"


@pytest.mark.parametrize("fmt,shard", [("gguf", 5 * 10**9), ("safetensors", 5 * 10**9), ("safetensors", 100_000)])
def test_reported_sha256_is_the_files(llamas, tmp_path, fmt, shard):
    """The sha256 is taken on another thread while the file is written: it must still be the file's."""
    from gptconv.output import sha256_file
    out = tmp_path / ("m.gguf" if fmt == "gguf" else "m")
    summary = export(str(llamas["llama3-gqa"]), out, fmt, "f32", max_shard_bytes=shard)
    for f in summary.files:
        path = out if fmt == "gguf" else out / f.name
        assert f.sha256 == sha256_file(path) and f.bytes == path.stat().st_size, f.name
    assert len(summary.files) > (4 if shard == "100KB" else 0)


@pytest.mark.parametrize("src_dtype,dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float16),
                                             (torch.float32, torch.float16), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_narrowing_finds_every_non_finite_value(src_dtype, dtype, bad):
    """The check is one aminmax per chunk (NaN propagates through it); a value anywhere is found."""
    from gptconv.writers.tensors import Narrowing
    narrow = Narrowing("m", clamp=False)
    narrow.CHUNK = 1000  # many chunks, with a ragged last one
    for shape, pos in [((37, 100), (0, 0)), ((37, 100), (20, 57)), ((37, 100), (36, 99)), ((5003,), (5002,))]:
        t = torch.randn(shape).to(src_dtype)
        assert torch.equal(narrow("w", t, dtype), t.to(dtype))
        t[pos] = bad
        with pytest.raises(GptconvError, match="'w' holds NaN or Inf"):
            narrow("w", t, dtype)
    for rows, cols in [(100, 37), (517, 300)]:  # a transposed view converts to the contiguous transpose,
        view = torch.randn(rows, cols).to(src_dtype).t()  # tile by tile, ragged edges included
        for chunk in (1000, Narrowing.CHUNK):
            narrow.CHUNK = chunk
            got = narrow("w", view, dtype)
            assert got.is_contiguous() and torch.equal(got, view.to(dtype))
        view[cols - 1, rows - 1] = bad
        with pytest.raises(GptconvError, match="'w' holds NaN or Inf"):
            narrow("w", view, dtype)
    assert narrow("w", torch.empty(0, 4), dtype).shape == (0, 4)


def test_narrowing_to_float16_range():
    from gptconv.writers.tensors import Narrowing
    t = torch.randn(64, 64)
    t[10, 3] = -7e4
    with pytest.raises(GptconvError, match=r"\|w\| = 70000 > 65504"):
        Narrowing("m", clamp=False)("w", t, torch.float16)
    got = Narrowing("m", clamp=True)("w", t, torch.float16)
    assert got[10, 3].item() == -65504 and torch.equal(got[11:], t[11:].half())


@pytest.mark.parametrize("src_dtype,dtype", [(torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)])
def test_16_bit_to_16_bit_goes_through_float32_exactly(src_dtype, dtype, monkeypatch):
    """bf16 ↔ f16 is converted through float32 a piece at a time (3× faster than torch's direct
    conversion): the same values, infinities and NaN included, across piece boundaries."""
    from gptconv.writers import tensors
    t = (torch.randn(600_001) * 300).to(src_dtype)
    t[[0, 262_144, 600_000]] = torch.tensor([float("inf"), float("nan"), 7e4]).to(src_dtype)
    for piece in (tensors._PIECE, 1000):
        monkeypatch.setattr(tensors, "_PIECE", piece)
        out = torch.empty(t.shape, dtype=dtype)
        tensors._copy(out, t)
        want = t.to(dtype)
        assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out.nan_to_num(), want.nan_to_num())
