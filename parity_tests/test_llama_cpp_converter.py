"""llama.cpp's own converter (convert_hf_to_gguf.py) is the yardstick for every GGUF we write.

On the same HF folder, both converters must write the same tensors (names, types, shapes, bytes) and
the same metadata, tokenizer arrays included, but for the keys listed below with the reason; and
what llama.cpp's converter writes must load in gptconv and verify against transformers and llama.cpp.
"""

from __future__ import annotations


import pytest

import gptconv
import llama_cpp_tools
from fixtures import CONVERTER_FIXTURES
from gptconv import verify
from gptconv.writers import export
from gptconv.llamacpp import LlamaCpp
from gptconv.parity.compare import FP32, LLAMA_CPP
from helpers import TORTURE, run_cli

# Metadata keys allowed to differ, and why. Nothing else may.
PROVENANCE = {
    "general.name": "the model's name: ours is the output file's stem, the converter's the folder name in words",
}
KNOWN = {
    ("smollm2-tied", "tokenizer.ggml.add_bos_token"):
        "the converter writes false for any vocabulary of exactly 49,152 tokens (its rule for IBM Granite's "
        "small models); SmolLM2's tokenizer adds no BOS, which is also llama.cpp's default for it, so ours is silent",
    ("mistral-swa", "llama.attention.sliding_window"):
        "the converter drops Mistral's window (llama.cpp's llama attends to every position); ours keeps it, so "
        "that gptconv reading the file back computes what transformers does; llama.cpp ignores the key",
}
# Every fixture at f32; q8_0 where the converter's type choices differ (GPT-2's positions and Mixtral's
# routers stay F32, rows not a multiple of 32 fall back) or the layout is new; f16 / bf16 where a tensor
# keeps F32 at any type (GPT-2's positions) and for the SentencePiece Llama (reading a 128k-token GGUF takes
# gguf's reader ~10 s, so not every pair).
Q8_0 = ("gpt2", "llama3-gqa-scaled", "smollm2-tied", "llama2-spm", "qwen2", "phi3", "mixtral")
CASES = [(name, "f32") for name in CONVERTER_FIXTURES] + [(name, "q8_0") for name in Q8_0] + [
    (name, dtype) for name in ("gpt2", "llama2-spm") for dtype in ("f16", "bf16")]


@pytest.fixture(scope="module")
def theirs(converter_fixtures, tmp_path_factory):
    root = tmp_path_factory.mktemp("theirs")
    made = {}

    def convert(name: str, dtype: str):
        if (name, dtype) not in made:
            made[name, dtype] = llama_cpp_tools.convert(converter_fixtures[name], root / f"{name}.{dtype}.gguf", dtype)
        return made[name, dtype]
    return convert


@pytest.mark.parametrize("name,dtype", CASES)
def test_our_gguf_equals_llama_cpps_converter(converter_fixtures, theirs, tmp_path, name, dtype):
    ours = tmp_path / f"{name}.{dtype}.gguf"
    export(str(converter_fixtures[name]), ours, "gguf", dtype)
    keys, tensors = llama_cpp_tools.differences(ours, theirs(name, dtype))
    assert tensors == []
    unexplained = {k: v for k, v in keys.items() if k not in PROVENANCE and (name, k) not in KNOWN}
    assert not unexplained


@pytest.mark.parametrize("name", list(CONVERTER_FIXTURES))
def test_llama_cpps_output_loads_tokenizes_and_verifies(converter_fixtures, theirs, parsed_once, tmp_path, name):
    path = theirs(name, "f32")
    tok = gptconv.load_tokenizer(str(path))
    with LlamaCpp(path, vocab_only=True) as llm:
        for text in TORTURE:
            assert tok.encode(text) == llm.tokenize(text), text
    if name == "mixtral":  # transformers' GGUF loader has no Mixtral: verify says so, in one line
        with pytest.raises(gptconv.GptconvError, match="transformers cannot read this GGUF file"):
            verify(str(path))
    else:
        report = verify(str(path))
        print(f"\n{name}: llama.cpp's converter output vs transformers: max|Δ| = {report.max_abs_diff:.3e} "
              f"at {report.inputs['random']} positions")
        assert report.passed and report.max_abs_diff <= FP32.atol, (report.first_divergent_step, report.notes)
    # against llama.cpp a windowed file is compared within its window (test_llama_cpp_ignores_sliding_windows);
    # our export of the folder is the same file but its name (test above), but for Mistral's window
    files = [path]
    if name == "mistral-swa":
        files.append(export(str(converter_fixtures[name]), tmp_path / "ours.gguf", "gguf", "f32").out)
    for file in files:
        report = verify(str(file), against="llama.cpp")
        print(f"{name}: {file.name} vs llama.cpp: max|Δ| = {report.max_abs_diff:.3e}")
        assert report.passed, (file, report.first_divergent_step, report.notes)
    # the same weights as our model of the HF folder, bit for bit
    model, folder = gptconv.load(path), gptconv.load(converter_fixtures[name])
    for (a, x), (b, y) in zip(model.state_dict().items(), folder.state_dict().items()):
        assert a == b and x.equal(y), a


@pytest.mark.parametrize("name", ["phi3", "mistral-swa"])
def test_llama_cpp_ignores_sliding_windows(converter_fixtures, tmp_path, name):
    """A known difference between the references, kept in sight: llama.cpp (0.3.36) runs Phi-3's and
    Mistral's GGUF files attending to every position, transformers within the window. Past the window
    llama.cpp's logits are those of our model with the window removed, and verify against it fails."""
    import dataclasses

    import torch
    from gptconv.models import build
    out = tmp_path / "m.gguf"
    export(str(converter_fixtures[name]), out, "gguf", "f32")
    model = gptconv.load(out)
    window = model.config.attention.window
    assert window is not None
    report = verify(str(out), against="llama.cpp", length=4 * window)
    assert not report.passed and report.first_divergent_step == "logits"
    assert any("past it the two differ by design" in note for note in report.notes)
    report = verify(str(out), against="llama.cpp")  # by default: within the window, and says so
    assert report.passed and report.inputs["random"] == window
    assert any("compared within the window" in note for note in report.notes)
    full = build(dataclasses.replace(model.config, attention=dataclasses.replace(model.config.attention, window=None))).eval()
    full.load_state_dict(model.state_dict())
    ids = list(range(100, 100 + 4 * window))
    with LlamaCpp(out, 4 * window) as llm, torch.no_grad():
        theirs = torch.tensor(llm.logits(ids))
        assert (full(torch.tensor([ids]))[0] - theirs).abs().max() <= LLAMA_CPP["llama"].atol


def test_a_sentencepiece_llama_from_the_converter_traces(theirs):
    r = run_cli("trace", theirs("llama2-spm", "f32"), "The capital of France is")
    assert r.returncode == 0, r.stderr
    assert "final_norm" in r.stdout and "next token" in r.stdout
