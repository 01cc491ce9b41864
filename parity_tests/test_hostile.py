"""Hostile and broken files: each gets our one-line error, never a traceback, a hang or code execution."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import run_cli
from hostile import gguf_tensor_info_positions, read_safetensors_header, write_safetensors
from test_cli_errors import one_line_error
from test_gguf_errors import write_llama_gguf


@pytest.fixture
def folder(ckpts, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(ckpts["tiny"], d)
    return d


def rewrite(folder, edit):
    f = folder / "model.safetensors"
    header, body = read_safetensors_header(f.read_bytes())
    f.write_bytes(edit(header, body))


def test_header_length_larger_than_the_file(folder):
    f = folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(struct.pack("<Q", len(data) * 10) + data[8:])
    one_line_error(run_cli("pull", folder), "model.safetensors", "not a readable safetensors file")


def test_header_that_is_not_json(folder):
    f = folder / "model.safetensors"
    data = f.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    f.write_bytes(data[:8] + b"{" + b"\xff" * (n - 1) + data[8 + n:])
    one_line_error(run_cli("pull", folder), "model.safetensors", "not a readable safetensors file")


def test_overlapping_offsets(folder):
    def edit(header, body):
        names = [k for k in header if k != "__metadata__"]
        a, b = header[names[0]]["data_offsets"], header[names[1]]
        b["data_offsets"] = [a[0], a[0] + b["data_offsets"][1] - b["data_offsets"][0]]
        return write_safetensors(header, body)
    rewrite(folder, edit)
    one_line_error(run_cli("pull", folder), "model.safetensors", "not a readable safetensors file")


def test_out_of_range_offsets(folder):
    def edit(header, body):
        last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
        header[last]["data_offsets"][1] += 4096
        return write_safetensors(header, body)
    rewrite(folder, edit)
    one_line_error(run_cli("pull", folder), "model.safetensors", "not a readable safetensors file")


def test_dtype_that_is_not_a_weight(folder):
    state = load_file(folder / "model.safetensors")
    state["transformer.wpe.weight"] = state["transformer.wpe.weight"].to(torch.int32)
    save_file(state, str(folder / "model.safetensors"))
    one_line_error(run_cli("pull", folder), "non-float tensor: 'transformer.wpe.weight' is torch.int32")


def test_extra_tensor(folder):
    state = load_file(folder / "model.safetensors")
    state["transformer.h.0.attn.rotary.inv_freq"] = torch.ones(8)
    save_file(state, str(folder / "model.safetensors"))
    one_line_error(run_cli("pull", folder), "unexpected tensor: 'transformer.h.0.attn.rotary.inv_freq'")


def test_absurd_config_is_refused_before_allocation(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(n_embd=65536, n_layer=1024, n_head=1024, vocab_size=9_000_000)  # each allowed, together ~55 TB
    (folder / "config.json").write_text(json.dumps(cfg))
    r = run_cli("pull", folder)  # the shapes disagree with the file long before anything is allocated
    one_line_error(r, "wrong shape")


@pytest.fixture
def gguf_file(tmp_path):
    return write_llama_gguf(tmp_path / "m.gguf")


def _patch(path, pos, fmt, value):
    data = bytearray(path.read_bytes())
    data[pos:pos + struct.calcsize(fmt)] = struct.pack(fmt, value)
    path.write_bytes(bytes(data))


def test_gguf_unknown_version(gguf_file):
    _patch(gguf_file, 4, "<I", 99)
    one_line_error(run_cli("pull", gguf_file), "GGUF version 99 is not supported")


@pytest.mark.parametrize("pos,label", [(8, "tensors"), (16, "metadata entries")])
def test_gguf_counts_in_the_billions(gguf_file, pos, label):
    _patch(gguf_file, pos, "<Q", 3_000_000_000)
    one_line_error(run_cli("pull", gguf_file), "3,000,000,000", "more than a")


def test_gguf_string_length_in_the_billions(gguf_file):
    _patch(gguf_file, 24, "<Q", 5_000_000_000)  # the first metadata key's length
    one_line_error(run_cli("pull", gguf_file), "m.gguf", "not a readable GGUF file")


def test_gguf_misaligned_offset(gguf_file):
    _, offset_pos = gguf_tensor_info_positions(gguf_file, 1)
    old = struct.unpack("<Q", gguf_file.read_bytes()[offset_pos:offset_pos + 8])[0]
    _patch(gguf_file, offset_pos, "<Q", old + 4)
    one_line_error(run_cli("pull", gguf_file), "not aligned to 32 bytes")


def test_gguf_offset_past_the_end(gguf_file):
    _, offset_pos = gguf_tensor_info_positions(gguf_file, 1)
    _patch(gguf_file, offset_pos, "<Q", 1 << 40)
    one_line_error(run_cli("pull", gguf_file), "m.gguf")


def test_gguf_unknown_tensor_type(gguf_file):
    type_pos, _ = gguf_tensor_info_positions(gguf_file, 1)
    _patch(gguf_file, type_pos, "<I", 999)
    one_line_error(run_cli("pull", gguf_file), "m.gguf", "not a readable GGUF file")
