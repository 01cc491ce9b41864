"""GGUF import errors: unsupported architecture, missing key, wrong shape, corrupt bytes: one line, exit 2."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from helpers import run_cli
from hostile import gguf_tensor_info_positions
from test_cli_errors import one_line_error


def write_llama_gguf(path, arch="llama", skip_key=None, bad_shape=False, n_layers=1, quant=None):
    """A one-layer (``n_layers``) Llama in F32; ``quant`` (a GGMLQuantizationType): its matrices in that type."""
    w = GGUFWriter(str(path), arch)
    meta = {"context_length": 64, "embedding_length": 32, "block_count": n_layers, "feed_forward_length": 64,
            "head_count": 4, "head_count_kv": 2, "layer_norm_rms_eps": 1e-5}
    adders = {"context_length": w.add_context_length, "embedding_length": w.add_embedding_length,
              "block_count": w.add_block_count, "feed_forward_length": w.add_feed_forward_length,
              "head_count": w.add_head_count, "head_count_kv": w.add_head_count_kv,
              "layer_norm_rms_eps": w.add_layer_norm_rms_eps}
    for key, value in meta.items():
        if key != skip_key:
            adders[key](value)
    w.add_vocab_size(100)
    rng = np.random.default_rng(0)
    t = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    if quant is not None:
        add = w.add_tensor
        w.add_tensor = lambda name, x: add(name, quantize(x, quant), raw_dtype=quant) if x.ndim == 2 else add(name, x)
    w.add_tensor("token_embd.weight", t(100, 32))
    for i in range(n_layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", t(32))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(32, 32))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(16, 32 if not bad_shape else 31))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(16, 32))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(32, 32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", t(32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(64, 32))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(64, 32))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(32, 64))
    w.add_tensor("output_norm.weight", t(32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_valid_file_loads(tmp_path):
    r = run_cli("pull", write_llama_gguf(tmp_path / "ok.gguf"))
    assert r.returncode == 0, r.stderr
    assert "architecture  llama" in r.stdout


def test_unsupported_architecture(tmp_path):
    one_line_error(run_cli("pull", write_llama_gguf(tmp_path / "mamba.gguf", arch="mamba")),
                   "mamba.gguf", "GGUF architecture 'mamba' is not supported")


@pytest.mark.parametrize("key", ["embedding_length", "block_count", "head_count"])
def test_missing_required_key(tmp_path, key):
    one_line_error(run_cli("pull", write_llama_gguf(tmp_path / "m.gguf", skip_key=key)),
                   "m.gguf", "missing metadata key")


def test_tensor_of_the_wrong_shape(tmp_path):
    one_line_error(run_cli("pull", write_llama_gguf(tmp_path / "s.gguf", bad_shape=True)),
                   "'blk.0.attn_k.weight' is [16, 31]", "needs [16, 32]")


def test_bad_magic_and_truncation(tmp_path):
    good = write_llama_gguf(tmp_path / "good.gguf").read_bytes()
    (tmp_path / "magic.gguf").write_bytes(b"GGUX" + good[4:])
    one_line_error(run_cli("pull", tmp_path / "magic.gguf"), "magic.gguf", "not a GGUF file (magic")
    (tmp_path / "cut.gguf").write_bytes(good[: len(good) // 2])
    one_line_error(run_cli("pull", tmp_path / "cut.gguf"), "cut.gguf")


def test_no_tokenizer_in_file_is_said(tmp_path):
    one_line_error(run_cli("trace", write_llama_gguf(tmp_path / "t.gguf"), "hello"), "t.gguf",
                   "carries no tokenizer")


def test_a_gguf_without_tokenizer_still_traces_ids_verifies_and_exports(tmp_path):
    """No tokenizer is not an error where none is needed: token ids, random-id parity, an HF folder."""
    f = write_llama_gguf(tmp_path / "t.gguf")
    r = run_cli("trace", f, "--ids", "1,2,3")
    assert r.returncode == 0 and "final_norm" in r.stdout, r.stderr
    r = run_cli("verify", f, "--length", "4")
    assert r.returncode == 0 and "PASSED" in r.stdout, r.stdout[-1500:] + r.stderr
    r = run_cli("export", f, "--format", "safetensors", "-o", tmp_path / "hf")
    assert r.returncode == 0 and (tmp_path / "hf" / "model.safetensors").exists(), r.stderr
    one_line_error(run_cli("export", f, "--format", "gguf", "-o", tmp_path / "x.gguf"), "t.gguf", "no tokenizer")


# --- The tensor table: llama.cpp refuses a file whose tensors' data is not laid out as the table says,
# and so must we (a file both we and transformers read wrongly would otherwise pass verify).

def patch_tensor(path, index, offset=None, ggml_type=None):
    """``path`` with tensor ``index``'s data offset (u64) and/or type (u32) in its table entry replaced."""
    type_pos, offset_pos = gguf_tensor_info_positions(path, index)
    data = bytearray(path.read_bytes())
    if offset is not None:
        struct.pack_into("<Q", data, offset_pos, offset)
    if ggml_type is not None:
        struct.pack_into("<I", data, type_pos, ggml_type)
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("command", [("trace", "--ids", "1,2,3"), ("verify", "--length", "4"),
                                     ("export", "--format", "safetensors", "-o", "OUT"), ("inspect",)],
                         ids=lambda c: c[0])
def test_an_offset_that_wraps_at_2_64_is_refused(tmp_path, command):
    """2^64 - 32 added to the data section's start in uint64 lands 32 bytes before it, in the header,
    aligned: read as weights, trace and export succeeded and verify said PASSED."""
    f = patch_tensor(write_llama_gguf(tmp_path / "w.gguf"), 2, offset=2**64 - 32)
    verb, *rest = (str(tmp_path / "out") if a == "OUT" else a for a in command)
    one_line_error(run_cli(verb, f, *rest), "w.gguf", "'blk.0.attn_q.weight'", "18,446,744,073,709,551,584",
                   "outside the file's tensor data")
    assert not (tmp_path / "out").exists()


F32, F16, BF16, F64, Q8_0, Q4_0 = (GGMLQuantizationType[n] for n in ("F32", "F16", "BF16", "F64", "Q8_0", "Q4_0"))


@pytest.mark.parametrize("stored,edit,needles", [
    # two tensors given one offset: the same bytes read as both
    (F32, lambda f: patch_tensor(f, 2, offset=0), ["'blk.0.attn_q.weight'", "overlaps tensor 'token_embd.weight'"]),
    # relabelled to a smaller type: half of the tensor's bytes read, the rest belonging to none
    (F32, lambda f: patch_tensor(f, 2, ggml_type=BF16), ["'blk.0.attn_k.weight'", "past the end of tensor "
                                                          "'blk.0.attn_q.weight' (BF16 [32, 32]: 2,048 bytes"]),
    (Q8_0, lambda f: patch_tensor(f, 2, ggml_type=Q4_0), ["past the end of tensor 'blk.0.attn_q.weight' (Q4_0 [32, 32]"]),
    # relabelled to a larger type: the tensor read into the next one's data
    (F32, lambda f: patch_tensor(f, 2, ggml_type=F64), ["'blk.0.attn_k.weight'", "overlaps tensor "
                                                         "'blk.0.attn_q.weight' (F64 [32, 32]"]),
    # two tensors of one size, their offsets swapped: no overlap, but not where llama.cpp looks
    (F32, lambda f: swap_offsets(f, 2, 5), ["'blk.0.attn_q.weight'", "llama.cpp expects it at 12,928"]),
], ids=["same-offset", "f32-as-bf16", "q8_0-as-q4_0", "f32-as-f64", "swapped"])
def test_a_tensor_table_llama_cpp_refuses_is_refused(tmp_path, stored, edit, needles):
    f = write_llama_gguf(tmp_path / "t.gguf", quant=None if stored == F32 else stored)
    assert run_cli("trace", f, "--ids", "1,2,3").returncode == 0  # the file as written loads
    edit(f)
    one_line_error(run_cli("trace", f, "--ids", "1,2,3"), "t.gguf", *needles)


def swap_offsets(path, i, j):
    """``path`` with tensors ``i`` and ``j``'s data offsets exchanged."""
    data = path.read_bytes()
    (_, a), (_, b) = gguf_tensor_info_positions(path, i), gguf_tensor_info_positions(path, j)
    patch_tensor(path, i, offset=struct.unpack_from("<Q", data, b)[0])
    return patch_tensor(path, j, offset=struct.unpack_from("<Q", data, a)[0])


def test_a_corrupt_block_scale_prints_no_numpy_warning(tmp_path):
    """A Q8_0 block whose scale is +Inf and whose quants are 0: dequantizing it multiplies Inf by 0,
    and numpy's "RuntimeWarning: invalid value encountered in multiply" came before our output, and
    before export's one error line."""
    from gguf import GGUFReader
    f = write_llama_gguf(tmp_path / "s.gguf", quant=Q8_0)
    start = next(t.data_offset for t in GGUFReader(f).tensors if t.name == "blk.0.attn_q.weight")
    data = bytearray(f.read_bytes())
    data[start:start + 34] = struct.pack("<H", 0x7C00) + bytes(32)  # f16 +Inf, then the block's 32 quants
    f.write_bytes(bytes(data))
    r = run_cli("trace", f, "--ids", "1,2,3")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    one_line_error(run_cli("export", f, "--format", "safetensors", "-o", tmp_path / "hf"), "s.gguf",
                   "holds NaN or Inf values")


# --- llama.cpp's own refusal, in its words: its errors (ggml's log level 4) were dropped, so a file it
# refused read "llama.cpp cannot load this file (no message)".

def test_llama_cpp_says_why_it_refuses_a_file(tmp_path):
    pytest.importorskip("llama_cpp")
    from gptconv.errors import GptconvError
    from gptconv.llamacpp import LlamaCpp, dequantize_file
    f = patch_tensor(write_llama_gguf(tmp_path / "t.gguf"), 2, offset=0)  # our reader refuses it first
    with pytest.raises(GptconvError, match=r"t\.gguf: llama\.cpp cannot load this file \(tensor "
                                           r"'blk\.0\.attn_q\.weight' has offset 0, expected 12928\)$"):
        LlamaCpp(f)
    with pytest.raises(GptconvError, match=r"cannot rewrite this file in F32 \(.*has offset 0, expected 12928\)$"):
        dequantize_file(f, tmp_path / "f32.gguf")  # llama.cpp's quantizer, in its own process


def test_llama_cpp_refusing_without_a_reason_points_to_inspect(tmp_path, monkeypatch):
    llama_cpp = pytest.importorskip("llama_cpp")
    from gptconv.errors import GptconvError
    from gptconv.llamacpp import LlamaCpp, library
    library()  # its log callback set, before the load that says nothing
    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", lambda *args: None)
    f = write_llama_gguf(tmp_path / "t.gguf")
    with pytest.raises(GptconvError) as e:
        LlamaCpp(f)
    assert str(e.value) == (f"{f}: llama.cpp cannot load this file and gave no reason; `gptconv inspect {f}` "
                            f"lists the file's metadata and tensors")
