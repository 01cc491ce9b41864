"""A recorded reference (``gptconv reference``) made hostile: ``python fuzz_references.py WORKDIR FOLDER REF``.
Each case is a copy of REF (recorded from FOLDER) with one thing changed: a metadata value removed or
replaced, one tensor of one input removed or given NaN, inf, zeros, huge values, another dtype or another
shape, its token ids past the vocabulary, or the file itself cut, emptied or its header length a lie.
``gptconv.verify(FOLDER, reference_file=case)`` must end in a verdict (a report) or a GptconvError naming
the file in one line, in bounded time and memory (fuzz.py's limits). Prints a JSON summary."""

from __future__ import annotations

import json
import resource
import signal
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from fuzz import MEMORY_LIMIT, _alarm, one_case

META = {"arch": ["gpt2x", ""], "weights": ["{}", "not json", '{"model.safetensors": "00"}'],
        "inputs": ["[]", '["nope"]', "[1, 2]", "{"], "gptconv_reference": ["99", ""], "source": [""],
        "transformers": ["0.0.1"]}


# a verdict on such a case must say what the file lacks or how it differs (else the verdict is unqualified)
MUST_SAY = {"metadata weights": "weights", "prompt0/ids zeros": "other token ids"}


def tensor_edits(vocab: int) -> list[tuple[str, Callable[[torch.Tensor], torch.Tensor | None]]]:
    return [
        ("removed", lambda t: None),
        ("NaN", lambda t: torch.full_like(t, float("nan")) if t.is_floating_point() else None),
        ("inf", lambda t: torch.full_like(t, float("inf")) if t.is_floating_point() else None),
        ("zeros", torch.zeros_like),
        ("x1e30", lambda t: t * 1e30 if t.is_floating_point() else t + 2**40),
        ("as float16", lambda t: t.to(torch.float16)),
        ("as int32", lambda t: t.to(torch.int32)),
        ("as bool", lambda t: t != 0),
        ("a position fewer", lambda t: t[:, :-1].clone()),
        ("a dimension more", lambda t: t[None].clone()),
        ("transposed", lambda t: t.transpose(0, -1).contiguous()),
        ("ids past the vocabulary", lambda t: torch.full_like(t, vocab + 5) if not t.is_floating_point() else None),
        ("negative ids", lambda t: torch.full_like(t, -1) if not t.is_floating_point() else None),
    ]


def cases(ref: Path, vocab: int):
    """(label, a function writing the case to a path)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(str(ref), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    first = sorted({k.split("/")[0] for k in tensors})[0]
    for key, values in META.items():
        for value in [None, *values]:
            def write(dst, key=key, value=value):
                m = {k: v for k, v in meta.items() if k != key}
                if value is not None:
                    m[key] = value
                save_file(tensors, str(dst), metadata=m)
            yield f"metadata {key} = {value!r}" if value is not None else f"metadata {key} removed", write
    kinds = [k for k in tensors if k.startswith(first + "/")]
    for name in kinds:
        for what, edit in tensor_edits(vocab):
            changed = edit(tensors[name])
            if changed is None and what != "removed":
                continue

            def write(dst, name=name, changed=changed):
                t = {k: v for k, v in tensors.items() if k != name}
                if changed is not None:
                    t[name] = changed
                save_file(t, str(dst), metadata=meta)
            yield f"{name} {what}", write
    data = ref.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    for what, raw in (("empty", b""), ("cut in half", data[:len(data) // 2]), ("zeros", bytes(len(data) // 4)),
                      ("header length 2^63", struct.pack("<Q", 2**63) + data[8:]),
                      ("header length one short", struct.pack("<Q", n - 1) + data[8:]),
                      ("its last byte gone", data[:-1])):
        yield what, lambda dst, raw=raw: dst.write_bytes(raw)


def main(workdir: Path, folder: Path, ref: Path) -> dict:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    import gptconv
    signal.signal(signal.SIGALRM, _alarm)
    vocab = gptconv.open_source(folder).config.vocab_size
    summary: dict[str, int] = {}
    failures: list[str] = []
    verdicts: dict[str, list[str]] = {}  # the cases that ended in one, by verdict
    target = workdir / "case.safetensors"
    for label, write in cases(ref, vocab):
        write(target)
        outcome, report = one_case(label, lambda: gptconv.verify(folder, reference_file=target), (target.name,),
                                   failures)
        if outcome == "done":
            outcome = "passed" if report.passed else "failed"
            if (said := next((n for k, n in MUST_SAY.items() if label.startswith(k)), None)) and \
                    not any(said in note for note in report.notes):
                failures.append(f"{label}: a verdict whose notes do not say '{said}': {report.notes}")
        outcome = "refused" if outcome == "error" else outcome
        summary[outcome] = summary.get(outcome, 0) + 1
        if outcome in ("passed", "failed"):
            verdicts.setdefault(outcome, []).append(label)
    return {"summary": summary, "failures": failures, "verdicts": verdicts}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))))
