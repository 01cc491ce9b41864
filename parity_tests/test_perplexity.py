"""Perplexity as llama-perplexity scores it, against transformers on the same windows, and the
quantized-vs-base figures (KL divergence, same top, Δppl)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import gptconv
from gptconv.writers import export
from helpers import hf_model, run_cli

TEXT = Path(__file__).parent / "data" / "alice-chapter-1.txt"


def transformers_perplexity(model, ids: list[int], ctx: int, bos: int | None) -> float:
    """llama-perplexity's windows, computed here from transformers' logits (not through gptconv.perplexity)."""
    nll = []
    for start in range(0, len(ids) - ctx + 1, ctx):
        window = list(ids[start:start + ctx])
        if bos is not None:
            window[0] = bos
        with torch.no_grad():
            logits = model(torch.tensor([window])).logits[0].double()
        lp = F.log_softmax(logits, -1)
        nll += [-lp[j, ids[start + j + 1]].item() for j in range(ctx // 2, ctx - 1)]
    return math.exp(sum(nll) / len(nll))


@pytest.mark.parametrize("fixture,name,ctx", [("ckpts", "tiny", 64), ("llamas", "llama3-gqa", 96),
                                              ("families", "mixtral", 96), ("families", "phi3", 64),
                                              ("converter_fixtures", "llama2-spm", 128)])  # adds BOS
def test_agrees_with_transformers(request, fixture, name, ctx):
    folder = request.getfixturevalue(fixture)[name]
    ours = gptconv.perplexity(folder, TEXT, ctx=ctx)
    tok = gptconv.load_tokenizer(folder)
    ids = tok.encode(TEXT.read_text())
    bos = tok.bos_id if ids[0] == tok.bos_id else None  # each window then starts with BOS, as in llama.cpp
    assert (bos is not None) == (name == "llama2-spm")
    theirs = transformers_perplexity(hf_model(folder), ids, ctx, bos)
    print(f"\n{name}: perplexity {ours.perplexity:.6f} (transformers {theirs:.6f}), {ours.windows} windows of {ctx}")
    assert ours.windows == len(ids) // ctx and ours.scored == ours.windows * (ctx // 2 - 1)
    assert abs(ours.perplexity - theirs) <= 1e-4 * theirs


def test_smollm2_real_weights_agree_with_transformers(smollm2):
    """Trained weights (SmolLM2's tokenizer adds no BOS, as llama.cpp's default for it), read by transformers'
    own GGUF loader for the reference."""
    from transformers import AutoModelForCausalLM
    ours = gptconv.perplexity(smollm2, TEXT, ctx=128)
    ids = gptconv.load_tokenizer(smollm2).encode(TEXT.read_text())
    ref = AutoModelForCausalLM.from_pretrained(smollm2.parent, gguf_file=smollm2.name, dtype=torch.float32).eval()
    theirs = transformers_perplexity(ref, ids, 128, None)
    print(f"\nSmolLM2-135M Q4_1 on Alice ch. 1: perplexity {ours.perplexity:.4f} (transformers {theirs:.4f}), "
          f"{ours.windows} windows of 128")
    assert 1.5 < ours.perplexity < 50  # a trained model on English prose
    assert abs(ours.perplexity - theirs) <= 1e-4 * theirs


def test_against_itself_is_zero_and_against_q8_0_is_not(llamas, tmp_path):
    folder = llamas["llama3-gqa"]
    same = gptconv.perplexity(folder, TEXT, ctx=64, against=folder)
    a = same.against
    assert a.kl_max == 0 and a.same_top == 1 and a.delta_perplexity == 0 and a.base_perplexity == same.perplexity
    q8 = export(str(folder), tmp_path / "q8.gguf", "gguf", "q8_0").out
    r = gptconv.perplexity(q8, TEXT, ctx=64, against=folder)
    a = r.against
    print(f"\nq8_0 against f32: Δppl {a.delta_perplexity:+.5f}, KL mean {a.kl_mean:.2e} p99 {a.kl_p99:.2e}, "
          f"same top {a.same_top:.2%}")
    assert a.base_perplexity == same.perplexity
    assert 0 < a.kl_mean <= a.kl_p99 <= a.kl_max and a.kl_median <= a.kl_p99
    assert 0.5 < a.same_top <= 1 and r.perplexity != a.base_perplexity


def test_cli_prints_and_json(llamas):
    r = run_cli("perplexity", llamas["tied"], TEXT, "--ctx", "32", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no progress bar off a terminal, nothing in --json
    out = json.loads(r.stdout)["result"]
    assert out["ctx"] == 32 and out["perplexity"] > 1 and out["against"] is None
    r = run_cli("perplexity", llamas["tied"], TEXT, "--ctx", "32", "--against", llamas["tied"])
    assert r.returncode == 0 and "perplexity" in r.stdout and "same top      100.00%" in r.stdout, r.stdout


@pytest.mark.parametrize("args,message", [
    (["--ctx", "33"], "--ctx 33: use an even window"),
    (["--ctx", "4096"], "--ctx 4096: the model has 64 positions"),
])
def test_bad_windows_are_one_line(llamas, args, message):
    r = run_cli("perplexity", llamas["tied"], TEXT, *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_text_shorter_than_a_window_and_another_tokenizer_are_refused(llamas, ckpts, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Down, down, down.")
    r = run_cli("perplexity", llamas["tied"], short, "--ctx", "32")
    assert r.returncode == 2 and "fewer than one window of 32" in r.stderr
    r = run_cli("perplexity", llamas["tied"], TEXT, "--ctx", "32", "--against", ckpts["tiny"])
    assert r.returncode == 2 and "does not split the text into the same tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli("perplexity", llamas["tied"], tmp_path / "none.txt")
    assert r.returncode == 2 and "no such file" in r.stderr


@pytest.mark.parametrize("name", ["llama2-spm", "smollm2"])  # adds BOS to each window; real weights
def test_in_llama_cpp_agrees_with_ours_on_an_f32_file(request, converter_fixtures, tmp_path, name):
    """--in llama.cpp: llama.cpp tokenizes and runs the file; on F32 weights its perplexity is ours."""
    source = request.getfixturevalue("smollm2") if name == "smollm2" else converter_fixtures[name]
    f32 = export(str(source), tmp_path / "m.gguf", "gguf", "f32").out
    ours = gptconv.perplexity(f32, TEXT, ctx=128)
    theirs = gptconv.perplexity(f32, TEXT, ctx=128, engine="llama.cpp")
    print(f"\n{name} f32: perplexity {ours.perplexity:.6f}, in llama.cpp {theirs.perplexity:.6f}")
    assert theirs.engine.startswith("llama.cpp (llama-cpp-python") and "(F32)" in theirs.engine
    assert (theirs.windows, theirs.scored) == (ours.windows, ours.scored)
    assert abs(ours.perplexity - theirs.perplexity) <= 1e-4 * ours.perplexity


def test_export_check_reports_the_file_just_written(wide_families, tmp_path):
    """export --check: the perplexity report of the written file against its source, run by gptconv
    (dequantized) or by llama.cpp (as stored), the same figures `perplexity OUT --against SOURCE` gives."""
    source = wide_families["qwen3"]
    for engine in ("gptconv", "llama.cpp"):
        out = tmp_path / f"{engine}.gguf"
        r = run_cli("export", source, "--format", "gguf", "--dtype", "q4_k_m", "-o", out, "--check", TEXT,
                    "--against", engine, "--json")
        assert r.returncode == 0 and r.stderr == "", r.stderr
        check = json.loads(r.stdout)["result"]["check"]
        again = gptconv.perplexity(out, TEXT, ctx=96, against=source, engine=engine).to_dict()
        assert check == {**again, "source": str(out), "against": {**again["against"], "base": str(source)}}
        assert check["ctx"] == 96 and 0 < check["against"]["kl_mean"] and check["against"]["same_top"] < 1
        assert check["engine"].startswith(engine)
    r = run_cli("export", source, "--format", "gguf", "--dtype", "q8_0", "-o", tmp_path / "t.gguf", "--check", TEXT)
    assert r.returncode == 0 and "KL(base‖this)" in r.stdout and "run by        gptconv, float32" in r.stdout


@pytest.mark.parametrize("args,message", [
    (["--check", "none.txt"], "none.txt: no such file"),
    (["--check", TEXT, "--check-ctx", "4096"], "--check-ctx 4096: the model has 96 positions"),
    (["--check", TEXT, "--against", "llama.cpp", "--format", "safetensors"], "--against llama.cpp runs a GGUF file"),
])
def test_export_check_refuses_before_writing_anything(wide_families, tmp_path, args, message):
    args = [*args, "--format", "gguf"] if "--format" not in args else args
    r = run_cli("export", wide_families["qwen3"], "-o", tmp_path / "out", *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert os.listdir(tmp_path) == []
