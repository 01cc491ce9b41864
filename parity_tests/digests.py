"""Every output of every model type, as sha256 digests: ``python digests.py WORKDIR OUT.json [NAME...]``.

For a refactoring that must change no output byte (issue 39's invariant): each fixture of every type (the
converter fixtures, each test_family_*.py's ARCH/VOCAB/SHAPE, Gemma 3, the multimodal wrappers) is made
(seeded, so the same files each run) and exported as HF f32, HF bf16, GGUF f32, f16, q8_0, and its GGUF f32
back to HF; the digests of every file written, of our float32 logits on a fixed input, and of the text
``trace`` prints are saved. A refusal is kept as its message. Run it before and after; compare the files."""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
from pathlib import Path

import torch

IDS = [1, 2, 3, 5, 8, 13, 21, 34]
EXPORTS = [("hf-f32", "safetensors", "f32"), ("hf-bf16", "safetensors", "bf16"), ("gguf-f32", "gguf", "f32"),
           ("gguf-f16", "gguf", "f16"), ("gguf-q8_0", "gguf", "q8_0")]


def fixtures() -> dict[str, callable]:
    """Each fixture's name and a function making it in a folder."""
    import llama_cpp_tools
    from fixtures import (CONVERTER_FIXTURES, WRAPPER_FIXTURES, make_checkpoint, make_converter_fixture, make_gemma3,
                          make_wrapper)
    from gptconv.demo import smollm2_gguf

    def converter(d: Path, name: str) -> Path:
        vocab = CONVERTER_FIXTURES[name][1]
        return make_converter_fixture(d, name, smollm2_gguf() if vocab == "smollm2" else llama_cpp_tools.vocab_file(vocab))
    out = {name: (lambda d, n=name: converter(d, n)) for name in CONVERTER_FIXTURES}
    for test in sorted(Path(__file__).parent.glob("test_family_*.py")):
        m = importlib.import_module(test.stem)
        if all(hasattr(m, a) for a in ("ARCH", "VOCAB", "SHAPE")):
            out[test.stem.removeprefix("test_family_")] = (
                lambda d, m=m: make_checkpoint(d, m.ARCH, m.VOCAB, m.SHAPE))
    out["gemma3"] = lambda d: make_gemma3(d)
    out.update({f"wrapper-{name}": (lambda d, n=name: make_wrapper(d, n)) for name in WRAPPER_FIXTURES})
    return out


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        h.update(f.relative_to(path.parent if path.is_file() else path).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def trace_text(folder: Path) -> str:
    """What ``gptconv trace --ids`` prints."""
    import contextlib
    import io

    import gptconv
    from gptconv.cli import render
    result = gptconv.trace(str(folder), ids=IDS)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        render.trace(result)
    return buf.getvalue()


def outputs(folder: Path, work: Path) -> dict[str, str]:
    import gptconv
    from gptconv.errors import GptconvError

    def attempt(fn):
        try:
            return fn()
        except GptconvError as e:
            return "refused: " + str(e).replace(str(work), "WORK")

    got: dict[str, str] = {}
    for label, fmt, dtype in EXPORTS:
        out = work / (label + (".gguf" if fmt == "gguf" else ""))
        r = attempt(lambda: gptconv.export(str(folder), out, fmt, dtype).out)
        got[label] = r if isinstance(r, str) else digest(Path(r))
    if (work / "gguf-f32.gguf").is_file():
        r = attempt(lambda: gptconv.export(str(work / "gguf-f32.gguf"), work / "gguf-to-hf", "safetensors").out)
        got["gguf-to-hf"] = r if isinstance(r, str) else digest(Path(r))
    model = attempt(lambda: gptconv.load(str(folder)))
    if not isinstance(model, str):
        with torch.no_grad():
            logits = model(torch.tensor([IDS]))
        got["logits"] = hashlib.sha256(logits.float().numpy().tobytes()).hexdigest()
    t = attempt(lambda: trace_text(folder))
    got["trace"] = t if t.startswith("refused") else hashlib.sha256(t.encode()).hexdigest()
    return got


def main(work: Path, out: Path, only: list[str]) -> None:
    made = fixtures()
    result = {}
    for name, make in made.items():
        if only and name not in only:
            continue
        case = work / name
        shutil.rmtree(case, ignore_errors=True)
        case.mkdir(parents=True)
        folder = make(case / "hf")
        result[name] = outputs(folder, case)
        print(name, json.dumps(result[name])[:200], flush=True)
        shutil.rmtree(case)
    out.write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
