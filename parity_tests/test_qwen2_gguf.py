"""Qwen2 GGUF files as llama.cpp's converter writes them (architecture ``qwen2``: Q/K rows in HF's
rotate-half order, not permuted; q/k/v biases) load, tokenize as llama.cpp and verify against
transformers and llama.cpp, with the same weights as the HF folder they came from."""

from __future__ import annotations

import pytest
import torch

import gptconv
import llama_cpp_tools
from gptconv.llamacpp import LlamaCpp
from gptconv.parity import FP32
from helpers import TORTURE


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """(an HF Qwen2 folder with llama.cpp's qwen2 test vocabulary, llama.cpp's f32 GGUF of it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from fixtures import _scramble_norms
    root = tmp_path_factory.mktemp("qwen2")
    folder = root / "qwen2"
    vocab = llama_cpp_tools.vocab_file("qwen2")
    from gguf import GGUFReader
    n_vocab = len(GGUFReader(vocab).fields["tokenizer.ggml.tokens"].data)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=n_vocab, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, rope_theta=1000000.0, initializer_range=0.2,
        tie_word_embeddings=False))
    _scramble_norms(model)
    model.save_pretrained(folder)
    llama_cpp_tools.hf_tokenizer_from_gguf(vocab, folder)
    return folder, llama_cpp_tools.convert(folder, root / "qwen2.f32.gguf", "f32")


def test_the_file_is_llama_cpps_qwen2(qwen2):
    from gguf import GGUFReader
    assert GGUFReader(qwen2[1]).fields["general.architecture"].contents() == "qwen2"


def test_same_weights_as_the_hf_folder(qwen2):
    folder, path = qwen2
    ours, theirs = gptconv.load(path), gptconv.load(folder)
    assert ours.config.qkv_bias and not ours.config.o_bias
    for (a, x), (b, y) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert a == b and x.equal(y), a


def test_tokenizes_as_llama_cpp(qwen2):
    path = qwen2[1]
    tok = gptconv.load_tokenizer(path)
    with LlamaCpp(path, vocab_only=True) as llm:
        for text in TORTURE:
            assert tok.encode(text) == llm.tokenize(text), text


def test_verifies_against_transformers_and_llama_cpp(qwen2):
    path = qwen2[1]
    report = gptconv.verify(path)
    print(f"\nqwen2 GGUF vs transformers: max|Δ| = {report.max_abs_diff:.3e}")
    assert report.passed and report.max_abs_diff <= FP32.atol, (report.first_divergent_step, report.notes)
    assert gptconv.verify(path, against="llama.cpp").passed


def test_a_missing_permutation_would_be_caught(qwen2, monkeypatch):
    """The check can fail: read with the llama architecture's Q/K permutation, the model diverges at once."""
    from gptconv import convert
    from gptconv.convert.llama import llama_gguf_keymap
    parse, _ = convert.GGUF_ARCHS["qwen2"]
    monkeypatch.setitem(convert.GGUF_ARCHS, "qwen2", (parse, lambda config: llama_gguf_keymap(config, "llama")))
    report = gptconv.verify(qwen2[1], length=32)
    assert not report.passed and report.first_divergent_step == "block.0"
