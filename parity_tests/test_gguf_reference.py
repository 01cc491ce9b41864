"""verify of GGUF files: transformers given the configuration the file encodes, and llama.cpp itself.

transformers' GGUF loader reads a few metadata keys and ignores a ``rope_freqs`` tensor (it builds
``rope_type: default``), so a correct Llama 3.1 / 3.2 file used to fail against it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from gguf import GGUFReader

import gptconv
from gptconv import verify
from gptconv.writers import export
from gptconv.parity.compare import FP32
from helpers import hf_model, random_ids, run_cli


@pytest.fixture(scope="module")
def scaled_ggufs(llamas, tmp_path_factory):
    root = tmp_path_factory.mktemp("scaled-gguf")
    out = {}
    for name in ("llama31-scaled", "llama32-deep"):
        out[name] = root / f"{name}.gguf"
        export(str(llamas[name]), out[name], "gguf", "f32")
    return out


@pytest.mark.parametrize("name", ["llama31-scaled", "llama32-deep"])
def test_llama3_scaled_gguf_passes_against_transformers(scaled_ggufs, llamas, name):
    assert "rope_freqs.weight" in {t.name for t in GGUFReader(scaled_ggufs[name]).tensors}
    report = verify(str(scaled_ggufs[name]))
    print(f"\n{name} GGUF vs transformers: max|Δ| = {report.max_abs_diff:.3e}")
    assert report.passed and report.max_abs_diff <= FP32.atol, report.first_divergent_step
    assert report.inputs["random"] == gptconv.load(llamas[name]).config.context_length  # past the original context


@pytest.mark.parametrize("name", ["llama31-scaled", "llama32-deep"])
def test_llama3_scaled_gguf_passes_against_llama_cpp(scaled_ggufs, name):
    r = run_cli("verify", scaled_ggufs[name], "--against", "llama.cpp", "--json")
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr
    report = json.loads(r.stdout)["result"]
    assert report["passed"] and report["reference"].startswith("llama.cpp")
    assert [s["name"] for s in report["steps"]] == ["logits"]
    assert any("tokenizes the 3 prompts as we do" in n for n in report["notes"])


def test_the_hf_export_of_a_scaled_gguf_says_llama3(scaled_ggufs, llamas, tmp_path):
    """rope_freqs → the llama3 parameters that give them; transformers then computes what it computes
    from the original folder, to fp32 rounding."""
    out = tmp_path / "back"
    export(str(scaled_ggufs["llama32-deep"]), out, "safetensors", "f32")
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    original = json.loads((llamas["llama32-deep"] / "config.json").read_text())["rope_parameters"]
    assert {k: rope[k] for k in original} == original
    ids = random_ids(384, 160, 1)
    with torch.no_grad():
        torch.testing.assert_close(hf_model(out)(ids).logits, hf_model(llamas["llama32-deep"])(ids).logits,
                                   rtol=0, atol=0)


def test_factors_no_llama3_scaling_gives_are_said_in_one_line(scaled_ggufs, tmp_path):
    path = tmp_path / "odd-factors.gguf"
    path.write_bytes(scaled_ggufs["llama31-scaled"].read_bytes())
    reader = GGUFReader(path, "r+")
    freqs = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
    freqs.data[:] = np.linspace(1.0, 3.0, freqs.data.size)[::-1]  # decreasing: no llama3 scaling does that
    reader.data.flush()
    del reader
    r = run_cli("verify", path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "transformers cannot represent this model" in r.stderr and "--against llama.cpp" in r.stderr
    assert run_cli("verify", path, "--against", "llama.cpp").returncode == 0  # llama.cpp reads the factors


def test_a_misread_config_field_fails_even_though_both_models_use_it(smollm2, parsed_once, monkeypatch):
    """The reference runs on our reading of the metadata, so a misread field would pass unseen:
    transformers' own reading of the file must agree with ours."""
    import dataclasses

    from gptconv import families
    from gptconv.layers.norms import Norms
    misread = tuple(dataclasses.replace(f, config_from_gguf=lambda fields, t, parse=f.config_from_gguf:
                                        dataclasses.replace(parse(fields, t), norms=Norms(eps=1e-3)))
                    for f in families.BY_GGUF_ARCH["llama"])
    monkeypatch.setitem(families.BY_GGUF_ARCH, "llama", misread)
    report = verify(str(smollm2), length=16)
    assert report.first_divergent_step is None  # both models computed with the same wrong eps
    assert not report.passed and any("rms_norm_eps" in n for n in report.notes)


def test_smollm2_q4_1_against_llama_cpp(smollm2):
    report = verify(str(smollm2), against="llama.cpp")
    print(f"\nSmolLM2 Q4_1 vs llama.cpp (F32 from its own dequantization): max|Δ| = {report.max_abs_diff:.3e}; "
          + report.notes[-1])
    assert report.passed and report.top1_agreement == 1.0
    assert "dequantized to F32 by llama.cpp's quantizer" in report.reference
    assert report.notes[-1].startswith("llama.cpp on the file as stored")


def test_a_planted_fault_fails_against_llama_cpp(smollm2, monkeypatch):
    """Our model without the Q/K un-permutation: llama.cpp, which never sees our code, catches it."""
    from gptconv.convert import gguf_decoder
    monkeypatch.setattr(gguf_decoder, "_unpermute", lambda w, n_heads: w)
    report = verify(str(smollm2), against="llama.cpp", length=64)
    assert not report.passed and report.first_divergent_step == "logits"


def test_llama_cpp_reference_refusals(ckpts, smollm2, tmp_path):
    r = run_cli("verify", ckpts["tiny"], "--against", "llama.cpp")
    assert r.returncode == 2 and "needs a GGUF file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli("verify", smollm2, "--against", "llama.cpp", "--dtype", "bfloat16")
    assert r.returncode == 2 and "runs in float32" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    blocker = tmp_path / "no-llama-cpp"
    blocker.mkdir()
    (blocker / "llama_cpp.py").write_text("raise ImportError('llama-cpp-python is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = run_cli("verify", smollm2, "--against", "llama.cpp", env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "gptconv[llama-cpp]" in r.stderr
