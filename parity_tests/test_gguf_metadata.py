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


@pytest.mark.parametrize("edit", ["model without its type", "merges as strings"])
def test_a_tokenizer_json_tokenizers_reads_gives_the_same_vocabulary(ckpts, tmp_path, edit):
    """The GGUF vocabulary is read from the folder's tokenizer.json; forms tokenizers accepts (a model
    without its "type", which it infers; merges as "a b" strings) write the same tokenizer keys."""
    import shutil

    from gptconv.loader import open_source
    from gptconv.tokenizer import load_tokenizer
    base = tmp_path / "base"
    shutil.copytree(ckpts["tiny"], base)
    spec = json.loads(load_tokenizer(open_source(base)).tk.to_str())
    for f in ("vocab.json", "merges.txt"):
        (base / f).unlink(missing_ok=True)
    (base / "tokenizer.json").write_text(json.dumps(spec))
    variant = tmp_path / "variant"
    shutil.copytree(base, variant)
    if edit == "model without its type":
        del spec["model"]["type"]
    else:
        spec["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    (variant / "tokenizer.json").write_text(json.dumps(spec))
    keys = []
    for folder in (base, variant):
        export(str(folder), tmp_path / f"{folder.name}.gguf", "gguf", "f32")
        keys.append({k: v for k, v in fields(tmp_path / f"{folder.name}.gguf").items() if k.startswith("tokenizer.")})
    assert keys[0] == keys[1] and keys[0]["tokenizer.ggml.merges"]
