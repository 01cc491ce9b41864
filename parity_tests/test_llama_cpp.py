"""llama.cpp (llama-cpp-python, F32 KV cache) runs our GGUF exports with matching logits.

llama.cpp is the reference GGUF consumer: if it loads our file and computes our logits, the
names, metadata, Q/K permutation, RoPE factors and tokenizer we wrote are what it expects.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gptconv
from gptconv.parity.compare import LLAMA_CPP, QUANTIZED_MIN_TOP1
from gptconv.writers import export
from helpers import random_ids

STRINGS = ["The capital of France is", "hello   world\t\ttabs\n\nnewlines", "café naïve Ærø",
           "emoji 🙂🚀", "digits 1234567890", "你好世界"]


NATURAL_TEXT = [
    "The capital of France is Paris, and the capital of Germany is Berlin. Both cities are known for their "
    "museums, their long histories and their food. Every year millions of visitors walk along the Seine and "
    "the Spree, take photographs of old bridges, and sit in cafés watching the people go by.",
    "def add(a, b):\n    return a + b\n\n\ndef mean(values):\n    if not values:\n        raise ValueError('empty')\n"
    "    return sum(values) / len(values)\n\n\nprint(add(2, 3), mean([1, 2, 3, 4]))\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife. Each morning "
    "he rowed out before sunrise, and each evening she waited for him on the rocks with a lantern, until one "
    "night the boat did not come back, and the whole village went out to search the dark water.",
    "<|im_start|>user\nExplain in two sentences why the sky is blue.<|im_end|>\n<|im_start|>assistant\n"
    "Sunlight is scattered by the molecules of the air, and blue light, with its shorter wavelength, is "
    "scattered much more than red light. So when we look at the sky away from the sun, we mostly see that "
    "scattered blue light.<|im_end|>\n",
]


@pytest.fixture(autouse=True)
def _plain_cpu_buffers(monkeypatch):
    """Weights stay in llama.cpp's plain CPU buffers (``use_extra_bufts = False``). On a CPU with AMX
    (Intel Sapphire Rapids and later) llama.cpp otherwise repacks quantized weights for it, and that
    path segfaults in ggml_backend_amx_mul_mat on our Q8_0 file (seen here; ggml-org/llama.cpp#20824
    reports it on other quant types). The plain path computes the same types with AVX2/AVX-512."""
    import llama_cpp.llama_cpp as lib
    defaults = lib.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = False
        return p
    monkeypatch.setattr(lib, "llama_model_default_params", params)


def llama_cpp(path, n_ctx: int):
    from llama_cpp import Llama
    return Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                 type_k=0, type_v=0, n_threads=2, verbose=False, seed=0)


def logits_of(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def compare(path, ids_list: list[list[int]], ours=None) -> tuple[float, bool, float]:
    """(max|Δ| of ours against llama.cpp, whether every input is within parity.LLAMA_CPP's tolerance for
    the architecture, top-1 agreement)."""
    ours = ours or gptconv.load(path)
    tol = LLAMA_CPP[ours.config.arch]
    llm = llama_cpp(path, max(len(i) for i in ids_list))
    diffs, within, agree, total = [], True, 0, 0
    for ids in ids_list:
        ref = logits_of(llm, ids)
        with torch.no_grad():
            mine = ours(torch.tensor([ids]))[0].numpy()
        diffs.append(float(np.abs(mine - ref).max()))
        within = within and diffs[-1] <= tol.allowed(torch.from_numpy(ref))
        agree += int((mine.argmax(-1) == ref.argmax(-1)).sum())
        total += len(ids)
    return max(diffs), within, agree / total


def test_smollm2_f32_export(smollm2, tmp_path):
    out = tmp_path / "smollm2.f32.gguf"
    export(str(smollm2), out, "gguf", "f32")
    tok = gptconv.load_tokenizer(out)
    prompts = ["The capital of France is", "def fibonacci(n):\n    return", "Once upon a time, there"]
    diff, within, top1 = compare(out, [tok.encode(p) for p in prompts] + [random_ids(49152, 200, 1)[0].tolist()])
    print(f"\nllama.cpp SmolLM2 f32: max|Δ| = {diff:.3e}, top-1 = {top1:.2%}")
    assert within and top1 >= LLAMA_CPP["llama"].min_top1
    llm = llama_cpp(out, 64)
    for text in STRINGS + ["<|im_start|>user\nHi<|im_end|>\n"]:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(text), text


@pytest.mark.parametrize("name", ["llama2-mha", "llama3-gqa", "llama31-scaled", "tied", "qwen2"])
def test_random_llama_f32_exports(llamas, tmp_path, name):
    out = tmp_path / f"{name}.gguf"
    export(str(llamas[name]), out, "gguf", "f32")
    ours = gptconv.load(llamas[name])
    n = ours.config.context_length  # llama31-scaled: 256 positions, 8× its original 32
    diff, within, top1 = compare(out, [random_ids(ours.config.vocab_size, n, 1, seed=s)[0].tolist() for s in range(2)], ours)
    print(f"\nllama.cpp {name}: max|Δ| = {diff:.3e}, top-1 = {top1:.2%}")
    assert within and top1 >= LLAMA_CPP["llama"].min_top1


@pytest.mark.parametrize("name", ["tiny", "odd", "gpt2-124m"])
def test_gpt2_f32_exports(ckpts, gpt2_124m, tmp_path, name):
    src = gpt2_124m if name == "gpt2-124m" else ckpts[name]
    out = tmp_path / f"{name}.gguf"
    export(str(src), out, "gguf", "f32")
    ours = gptconv.load(src)
    n = min(ours.config.context_length, 512)
    diff, within, top1 = compare(out, [random_ids(ours.config.vocab_size, n, 1)[0].tolist()], ours)
    print(f"\nllama.cpp {name}: max|Δ| = {diff:.3e}, top-1 = {top1:.2%}")
    assert within and top1 >= LLAMA_CPP["gpt2"].min_top1
    llm = llama_cpp(out, 64)
    tok = gptconv.load_tokenizer(src)
    for text in STRINGS + ["<|endoftext|>"]:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(text), text


@pytest.fixture(scope="module")
def smollm2_f32(smollm2):
    return gptconv.load(smollm2)


def test_smollm2_f16_export_keeps_top1(smollm2, smollm2_f32, tmp_path):
    out = tmp_path / "smollm2.f16.gguf"
    export(str(smollm2), out, "gguf", "f16")
    tok = gptconv.load_tokenizer(smollm2)
    diff, within, top1 = compare(out, [tok.encode(t) for t in NATURAL_TEXT], smollm2_f32)
    print(f"\nllama.cpp SmolLM2 f16: max|Δ| = {diff:.3e}, top-1 vs our f32 = {top1:.2%}")
    assert top1 >= QUANTIZED_MIN_TOP1


@pytest.fixture(scope="module")
def smollm2_q8(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("q8") / "smollm2.q8_0.gguf"
    export(str(smollm2), out, "gguf", "q8_0")
    return out


def test_q8_0_export_holds_gguf_quants_values(smollm2_f32, smollm2_q8):
    """Every 2-D weight is exactly gguf.quants' Q8_0 of ours (through the Q/K permutation)."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize
    back = gptconv.load(smollm2_q8)
    for (name, a), (_, b) in zip(smollm2_f32.named_parameters(), back.named_parameters()):
        if a.ndim == 2:
            expect = torch.from_numpy(dequantize(quantize(a.detach().numpy(), Q.Q8_0), Q.Q8_0))
            assert torch.equal(expect, b.detach()), name  # permuting rows commutes with per-row blocks
        else:
            assert torch.equal(a, b), name


def test_q8_0_export_runs_in_llama_cpp_like_its_weights(smollm2, smollm2_q8):
    """llama.cpp on our Q8_0 file against our model on the same Q8_0 weights (it also rounds activations to 8 bits)."""
    tok = gptconv.load_tokenizer(smollm2)
    diff, within, top1 = compare(smollm2_q8, [tok.encode(t) for t in NATURAL_TEXT], gptconv.load(smollm2_q8))
    print(f"\nllama.cpp SmolLM2 q8_0 vs our q8_0 weights: max|Δ| = {diff:.3e}, top-1 = {top1:.2%}")
    assert top1 >= QUANTIZED_MIN_TOP1


# What Q8_0 (and every other type) costs SmolLM2 against its f32 export is measured, not asserted against a
# guess: `python -m gptconv.bench.quality` (the README's table). Equality with llama.cpp's converter and
# quantizer is the test (test_llama_cpp_converter.py, test_quantized_export.py).
