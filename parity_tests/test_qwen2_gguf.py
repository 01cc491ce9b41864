"""Qwen2 in GGUF as llama.cpp's converter writes it: architecture ``qwen2``, Q/K rows in HF's
rotate-half order (not permuted, unlike ``llama``), q/k/v biases. Loading, tokenizing, verifying and
our own export of the same folder are checked with every converter fixture in
test_llama_cpp_converter.py; here, what is particular to this architecture."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

import gptconv
import llama_cpp_tools
from gptconv.writers import export


@pytest.fixture(scope="module")
def theirs(converter_fixtures, tmp_path_factory):
    return llama_cpp_tools.convert(converter_fixtures["qwen2"], tmp_path_factory.mktemp("qwen2") / "q.gguf", "f32")


def test_both_converters_write_qwen2_unpermuted(converter_fixtures, theirs, tmp_path):
    ours = export(converter_fixtures["qwen2"], tmp_path / "q.gguf", "gguf", "f32").out
    for path in (theirs, ours):
        assert GGUFReader(path).fields["general.architecture"].contents() == "qwen2"
    model = gptconv.load(theirs)
    assert model.config.attention.qkv_bias and not model.config.attention.o_bias


def test_reading_it_with_the_llama_permutation_fails_at_block_0(theirs, parsed_once, monkeypatch):
    """The check can fail: read with the llama architecture's Q/K permutation, the model diverges at once."""
    import dataclasses

    from gptconv import families
    from gptconv.convert.gguf_decoder import decoder_gguf_keymap, standard_layer
    (qwen2,) = families.BY_GGUF_ARCH["qwen2"]
    permuted = lambda config: decoder_gguf_keymap(config, "llama", standard_layer(permuted=True))  # noqa: E731
    monkeypatch.setitem(families.BY_GGUF_ARCH, "qwen2", (dataclasses.replace(qwen2, gguf_keymap=permuted),))
    report = gptconv.verify(theirs, length=32)
    assert not report.passed and report.first_divergent_step == "block.0"
