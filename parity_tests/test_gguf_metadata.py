"""What an export keeps of a GGUF source's tokenizer, and the keys llama.cpp's converter writes."""

from __future__ import annotations

import json

import pytest
from gguf import GGUFReader

from gptconv.writers import export


def fields(path) -> dict:
    return {k: f.contents() for k, f in GGUFReader(path).fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def smollm2_source(smollm2):
    return fields(smollm2)


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_gguf_to_gguf_keeps_every_tokenizer_key(smollm2, smollm2_source, tmp_path, dtype):
    out = tmp_path / f"smollm2.{dtype}.gguf"
    export(str(smollm2), out, "gguf", dtype)
    ours = fields(out)
    tokenizer = {k for k in smollm2_source if k.startswith("tokenizer.")}
    assert {k: ours.get(k) for k in tokenizer} == {k: smollm2_source[k] for k in tokenizer}
    assert ours["tokenizer.ggml.unknown_token_id"] == 0 and ours["tokenizer.ggml.padding_token_id"] == 2
    assert ours["general.quantization_version"] == 2  # the GGUF spec requires it of quantized files
    assert ours["llama.attention.key_length"] == ours["llama.attention.value_length"] == 64


def test_gguf_to_hf_keeps_pad_and_unk(smollm2, tmp_path):
    from transformers import AutoTokenizer
    out = tmp_path / "hf"
    export(str(smollm2), out, "safetensors", "f32")
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert (config["unk_token"], config["pad_token"]) == ("<|endoftext|>", "<|im_end|>")
    hf = AutoTokenizer.from_pretrained(out)
    assert (hf.unk_token_id, hf.pad_token_id) == (0, 2)
    back = tmp_path / "back.gguf"
    export(str(out), back, "gguf", "f32")
    again = fields(back)
    assert again["tokenizer.ggml.unknown_token_id"] == 0 and again["tokenizer.ggml.padding_token_id"] == 2


def test_gpt2_positions_stay_f32(ckpts, tmp_path):
    for dtype in ("f16", "bf16", "q8_0"):
        out = tmp_path / f"gpt2.{dtype}.gguf"
        export(str(ckpts["tiny"]), out, "gguf", dtype)
        types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
        assert types["position_embd.weight"] == "F32", dtype  # as llama.cpp's converter keeps it
        assert types["token_embd.weight"] == dtype.upper()
