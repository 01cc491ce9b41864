"""llama.cpp as verify's reference: our model against llama.cpp on the same ids (logits, top-1, KL), the
prompts tokenized by both, and the file as stored reported beside, not judged."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..errors import GptconvError, where
from ..llamacpp import LlamaCpp, dequantize_file, library, version
from .compare import LLAMA_CPP, PROMPTS, Report, compare_fixed, kl_per_position


def verify_gguf(src: Any, model: nn.Module, inputs: dict[str, torch.Tensor]) -> Report:
    """Our model against llama.cpp on the same ids: logits, top-1 and KL, and the tokenizer.

    A file whose weights are not all F32 is first rewritten in F32 by llama.cpp's own quantizer, so
    that both sides compute on the same weights (each dequantized by its own code); llama.cpp's
    quantized kernels also round the activations (to 8 bits for Q4/Q8 weights, to F16 for F16), and
    the file as stored is reported beside, not judged.
    """
    library()
    if src.format != "gguf":
        raise where(src.path, "verify --against llama.cpp needs a GGUF file (export one with "
                              "`gptconv export --format gguf`)")
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("llama.cpp's reference is float32: compare a float32 model")
    n_ctx = max(ids.shape[1] for ids in inputs.values())
    types = sorted(set(src.stored_types.values()))
    stored_f32 = types == ["F32"]
    with tempfile.TemporaryDirectory(prefix="gptconv-llama-cpp-") as tmp:
        path = src.path
        if not stored_f32:
            path = Path(tmp) / "f32.gguf"
            need = 4 * sum(int(np.prod(t.shape)) for t in src.tensors.values())
            free = shutil.disk_usage(tmp).free
            if need > 0.95 * free:
                raise GptconvError(f"{tmp}: llama.cpp's F32 copy of {src.path.name} needs {need / 1e9:.1f} GB, "
                                   f"{free / 1e9:.1f} GB are free (set TMPDIR to a larger disk)")
            dequantize_file(src.path, path)
        weights = "F32 file" if stored_f32 else f"weights ({', '.join(types)}) dequantized to F32 by llama.cpp's quantizer"
        with LlamaCpp(path, n_ctx) as llm:
            def logits(name: str, ids: torch.Tensor) -> dict[str, torch.Tensor]:
                return {"logits": torch.from_numpy(llm.logits(ids[0].tolist()))[None]}  # llama.cpp gives no other step
            report = compare_fixed(model, inputs, logits, str(src.name),
                             f"llama.cpp (llama-cpp-python {version()}, {weights}, F32 KV cache)",
                             tolerance=LLAMA_CPP[src.arch])
    _check_tokenizer(src, report)
    if not stored_f32:
        report.notes.append(_as_stored(src, model, inputs, n_ctx, types))
    return report


def _check_tokenizer(src: Any, report: Report) -> None:
    """The prompts tokenized by llama.cpp and by us: a difference fails the report."""
    from ..tokenizer import load_tokenizer
    tok = load_tokenizer(src)
    with LlamaCpp(src.path, vocab_only=True) as vocab:
        for text in PROMPTS:
            ours, theirs = tok.encode(text), vocab.tokenize(text)
            if ours != theirs:
                first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                report.notes.append(f"llama.cpp tokenizes {text[:30]!r} differently from us, first at token {first} "
                                    f"(ours {ours[first:first + 3]}, llama.cpp {theirs[first:first + 3]})")
                report.passed = False
                return
    report.notes.append(f"llama.cpp tokenizes the {len(PROMPTS)} prompts as we do")


def _as_stored(src: Any, model: nn.Module, inputs: dict[str, torch.Tensor], n_ctx: int, types: list[str]) -> str:
    agree = total = 0
    kls = []
    with LlamaCpp(src.path, n_ctx) as llm, torch.no_grad():
        for ids in inputs.values():
            theirs = torch.from_numpy(llm.logits(ids[0].tolist()))
            ours = model(ids)[0].float()
            agree += int((theirs.argmax(-1) == ours.argmax(-1)).sum())
            total += ids.shape[1]
            kls.append(kl_per_position(ours, theirs))
    kl = torch.cat(kls)
    return (f"llama.cpp on the file as stored ({', '.join(types)} kernels, which also round activations), not judged: "
            f"top-1 agreement {agree / total:.2%}, KL mean {kl.mean().item():.3e}, max {kl.max().item():.3e}")
