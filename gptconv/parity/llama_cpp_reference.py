"""llama.cpp as verify's reference: our model against llama.cpp on the same ids (logits, top-1, KL), the
prompts tokenized by both, and the file as stored reported beside, not judged."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from .. import memory
from ..errors import GptconvError, where
from ..llamacpp import LlamaCpp, dequantize_file, library, version
from .compare import PROMPTS, Fixed, Report, kl_per_position, llama_cpp_tolerance, max_abs_diff
from .lockstep import Run, lockstep, our_run


def verify_gguf(src: Any, make_model: Callable[[torch.dtype], nn.Module], inputs: dict[str, torch.Tensor]) -> Report:
    """Our model against llama.cpp on the same ids: logits, top-1 and KL, and the tokenizer.

    A file whose weights are not all F32 is first rewritten in F32 by llama.cpp's own quantizer, so
    that both sides compute on the same weights (each dequantized by its own code); llama.cpp's
    quantized kernels also round the activations (to 8 bits for Q4/Q8 weights, to F16 for F16), and
    the file as stored is reported beside, not judged. llama.cpp runs first (see ``_logits``) and is
    closed before ``make_model(dtype)`` makes ours, in float32 and in float64 (the float64 run measures
    our own float32 rounding, which widens the bound: ``compare.Fixed``); the two then run in lockstep
    beside llama.cpp's logits alone (streamed where they are).
    """
    library()
    if src.format != "gguf":
        raise where(src.path, "verify --against llama.cpp needs a GGUF file (export one with "
                              "`gptconv export --format gguf`)")
    types = sorted(set(src.stored_types.values()))
    stored_f32 = types == ["F32"]
    names, sequences = list(inputs), [ids[0].tolist() for ids in inputs.values()]
    start = time.perf_counter()
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
        theirs = _logits(path, sequences, names)
    stored = None if stored_f32 else _logits(src.path, sequences, names)
    llama_seconds = time.perf_counter() - start
    peaks = {"llama.cpp": memory.peak()}  # its model's pages mapped, its buffers, the logits of every input
    apart = memory.reset_peak()
    exact, model = make_model(torch.float64), make_model(torch.float32)
    tally = Fixed(str(src.name), f"llama.cpp (llama-cpp-python {version()}, {weights}, F32 KV cache)",
                  llama_cpp_tolerance(src.config), inputs)
    as_stored = {"agree": 0, "total": 0, "kls": []}

    ours64: dict[str, torch.Tensor] = {}

    def take(step: str, run: Run, name: str, ours: torch.Tensor) -> None:
        if step != "logits":  # a streamed block's stop (see ``our_run``): nothing of llama.cpp's to compare
            return
        if run.role == EXACT_RUN:  # runs first: our float64 logits, held until our float32 run's
            ours64[name] = ours.detach().cpu()
            return
        ours = ours.detach().float().cpu()
        tally.add("logits", ours, theirs.pop(name), max_abs_diff(ours, ours64.pop(name)))
        if stored is not None:
            other = stored.pop(name)
            as_stored["agree"] += int((other.argmax(-1) == ours.argmax(-1)).sum())
            as_stored["total"] += ours.shape[1]
            as_stored["kls"].append(kl_per_position(ours, other))
    seconds = lockstep([our_run(exact, set(), EXACT_RUN), our_run(model, set())], inputs, take)
    report = tally.verdict()
    report.seconds = {"llama.cpp": llama_seconds, **seconds}
    report.peaks = peaks | ({"ours": memory.peak()} if apart else {})
    _check_tokenizer(src, report)
    if stored is not None:
        kl = torch.cat(as_stored["kls"])
        report.notes.append(
            f"llama.cpp on the file as stored ({', '.join(types)} kernels, which also round activations), not judged: "
            f"top-1 agreement {as_stored['agree'] / as_stored['total']:.2%}, KL mean {kl.mean().item():.3e}, "
            f"max {kl.max().item():.3e}")
    return report


EXACT_RUN = "ours in float64"  # the run that measures our own float32 rounding


def _logits(path: Path, sequences: list[list[int]], names: list[str]) -> dict[str, torch.Tensor]:
    """llama.cpp's logits (1, T, V) of each sequence, by input name: each alone where the file fits in
    memory (its pages stay cached between them), else all in one batch of as many sequences, so that
    llama.cpp reads a file larger than memory once, not once a sequence (the two round differently in
    float32: llama.cpp sums a sequence's attention over the cells of all of them)."""
    if fits_in_memory(path):
        with LlamaCpp(path, max(len(ids) for ids in sequences)) as llm:
            return {name: torch.from_numpy(llm.logits(ids))[None] for name, ids in zip(names, sequences)}
    with LlamaCpp(path, sum(len(ids) for ids in sequences), n_seq=len(sequences)) as llm:
        return {name: torch.from_numpy(t)[None] for name, t in zip(names, llm.logits_of_each(sequences))}


def fits_in_memory(path: Path) -> bool:
    """Whether a file's pages can stay cached from one llama.cpp pass to the next."""
    return path.stat().st_size < memory.available()


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
