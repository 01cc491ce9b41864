"""`gptconv inspect` on a folder, a safetensors file and a GGUF file."""

from __future__ import annotations

import json

from helpers import run_cli


def test_inspect_folder_and_file(ckpts):
    r = run_cli("inspect", ckpts["tiny"], "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["result"]
    assert out["kind"] == "hf-folder" and out["config"]["model_type"] == "gpt2"
    names = {t["name"]: t for t in out["tensors"]}
    assert names["transformer.wte.weight"]["shape"] == [512, 64] and names["transformer.wte.weight"]["dtype"] == "float32"
    r = run_cli("inspect", ckpts["tiny"] / "model.safetensors")
    assert r.returncode == 0 and "transformer.h.1.mlp.c_fc.weight" in r.stdout and "metadata format = pt" in r.stdout


def test_inspect_gguf(smollm2):
    r = run_cli("inspect", smollm2, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["result"]
    assert out["kind"] == "gguf" and out["metadata"]["general.architecture"] == "llama"
    assert out["metadata"]["tokenizer.ggml.tokens"] == "[49,152 items]"
    q = {t["name"]: t for t in out["tensors"]}["blk.0.attn_q.weight"]
    assert q == {"name": "blk.0.attn_q.weight", "dtype": "Q4_1", "shape": [576, 576]}


def test_inspect_output_cut_short_is_quiet(smollm2):
    import subprocess
    import sys
    r = subprocess.run(f"{sys.executable} -m gptconv inspect {smollm2} | head -3", shell=True, capture_output=True,
                       text=True)
    assert len(r.stdout.splitlines()) == 3 and "Error" not in r.stderr
