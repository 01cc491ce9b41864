"""Real trained weights: SmolLM2-135M-Instruct from its Q4_1 GGUF, against transformers' own GGUF loader.

Both sides dequantize the same file, so the weights are equal and fp32 logits must match.
"""

from __future__ import annotations

import pytest
import torch

import gptconv
from helpers import assert_fp32_parity

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived",
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
]

STRINGS = [
    "The capital of France is",
    "hello   world\t\ttabs\n\n\nnewlines    and runs",
    "   leading and trailing   ",
    "café naïve Ærø Ünïcödé",
    "你好世界, こんにちは, 안녕하세요",
    "emoji 🙂🚀👩‍👩‍👧",
    "digits 1234567890 3.14159 -42 x2024y",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
]


@pytest.fixture(scope="module")
def ours(smollm2):
    return gptconv.load(smollm2)


@pytest.fixture(scope="module")
def tok(smollm2):
    return gptconv.load_tokenizer(smollm2)


@pytest.fixture(scope="module")
def reference(smollm2):
    from gptconv.parity.hf_reference import load_transformers_model
    return load_transformers_model(smollm2)


def test_config_from_gguf_metadata(ours):
    c = ours.config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.vocab_size) == (30, 9, 3, 576, 49152)
    assert c.tie_embeddings and c.rope.theta == 100000.0
    assert sum(p.numel() for p in ours.parameters()) == 134_515_008


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_match_transformers_gguf_loader(ours, tok, reference, prompt):
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        assert_fp32_parity(ours(ids), reference(ids).logits, f"SmolLM2 {prompt[:24]!r}")


def test_paris(ours, tok):
    with torch.no_grad():
        logits = ours(torch.tensor([tok.encode("The capital of France is")]), last_only=True)
    assert tok.decode([int(logits[0, -1].argmax())]) == " Paris"


def test_token_ids_equal_transformers(smollm2, tok):
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)
    for text in STRINGS:
        assert tok.encode(text) == ref(text)["input_ids"], text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok.apply_chat_template(messages) == ref.apply_chat_template(messages, tokenize=False,
                                                                         add_generation_prompt=True)


def test_chat_generation_answers(ours, tok):
    from gptconv.decoding import generate_ids as generate
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    out = tok.decode(generate(ours, ids, 16, stop_ids={tok.eos_id}), skip_special_tokens=True)
    assert "Paris" in out
