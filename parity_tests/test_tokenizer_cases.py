"""llama.cpp's own tokenizer tests, run on our tokenizers: its ggml-vocab-*.gguf vocabularies (real
ones: GPT-2, Llama 3, Llama 2, Phi-3, Qwen2, Gemma 4) with their .inp / .out cases (the ids transformers gives
for the models' own tokenizers), and llama.cpp itself tokenizing the torture set."""

from __future__ import annotations

from functools import cache

import pytest

import gptconv
import llama_cpp_tools
from gptconv.llamacpp import LlamaCpp
from helpers import TORTURE

VOCABULARIES = ["gpt-2", "llama-bpe", "llama-spm", "phi-3", "qwen2", "gemma-4"]  # every family we support


@cache
def tokenizer(name: str):
    return gptconv.load_tokenizer(str(llama_cpp_tools.vocab_file(name)))


@pytest.mark.parametrize("name", VOCABULARIES)
def test_llama_cpp_vocabulary_cases(name):
    tok = tokenizer(name)
    cases = llama_cpp_tools.vocab_cases(name)
    failed = [(text, tok.encode(text, add_special_tokens=False), ids) for text, ids in cases
              if tok.encode(text, add_special_tokens=False) != ids]
    print(f"\n{name}: {len(cases) - len(failed)}/{len(cases)} of llama.cpp's cases")
    assert not failed, failed[:3]


@pytest.mark.parametrize("name", VOCABULARIES)
def test_ids_equal_llama_cpp_on_the_torture_set(name):
    path = llama_cpp_tools.vocab_file(name)
    tok = tokenizer(name)
    with LlamaCpp(path, vocab_only=True) as llm:
        for text in TORTURE:
            for add in (True, False):  # with and without the BOS / EOS the vocabulary adds
                assert tok.encode(text, add_special_tokens=add) == llm.tokenize(text, add_special=add), (text, add)
    for text in TORTURE:
        if text and "<" not in text:  # special tokens decode to their text too; the rest round-trips
            assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, text
