"""The library functions behind each CLI command: pull, trace, verify, reference, inspect."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .sources.hf_folder import open_hf_folder, read_safetensors, read_torch_bin
from .errors import GptconvError, NoTokenizer, where
from .output import check_output
from .loader import Source, load_source, open_source, parse_dtype
from .reference import (gguf_config_disagreements, parity_inputs, read_reference, reference_steps, save_reference,
                        transformers_model)
from .tokenizer import Tokenizer, load_tokenizer
from .verify import Report, compare


@dataclass
class PullSummary:
    source: str
    repo_id: str | None
    folder: Path
    arch: str
    parameters: int
    dtypes: dict[str, int]  # source dtype → tensor count
    files: list[tuple[str, int]]  # (name, bytes)
    context_length: int
    layout: str


def pull(source: str, revision: str | None = None) -> PullSummary:
    """Download (or find) the checkpoint, map and check every tensor, and summarise it."""
    src = open_source(source, revision, prefer_cache=False)
    model = load_source(src)  # the full strict load: every tensor read, mapped and checked
    dtypes = Counter(src.stored_types.values())
    return PullSummary(
        source, src.repo_id, src.path, src.arch, sum(p.numel() for p in model.parameters()), dict(dtypes),
        [(f.name, f.stat().st_size) for f in src.files], src.config.context_length, src.layout,
    )


def tokenizer_or_none(src: Source) -> Tokenizer | None:
    try:
        return load_tokenizer(src)
    except NoTokenizer:  # none at all; one that cannot be read is an error
        return None


def encode_prompt(src: Source, text: str | None, ids: str | None) -> list[int]:
    """Token ids from ``text`` (through the checkpoint's tokenizer) or from a list like "464,3139"."""
    if ids is not None:
        try:
            out = [int(t) for t in ids.replace(",", " ").split()]
        except ValueError:
            raise GptconvError(f"--ids '{ids}': expected integers separated by commas or spaces") from None
        bad = [i for i in out if not 0 <= i < src.config.vocab_size]
        if bad or not out:
            raise GptconvError(f"--ids: {bad[0] if bad else 'nothing'} is not a token id in 0 … {src.config.vocab_size - 1}")
    elif text is None:
        raise GptconvError("give a TEXT or --ids")
    else:
        out = load_tokenizer(src).encode(text)
        if not out:
            raise GptconvError("the text gives no tokens")
    if len(out) > src.config.context_length:
        raise GptconvError(f"the prompt is {len(out):,} tokens; this model's context holds "
                           f"{src.config.context_length:,}")
    return out


REFERENCES = ("transformers", "llama.cpp")


def verify_source(source: str, dtype: str = "float32", length: int | None = None, seed: int = 0,
                  reference_file: Path | None = None, revision: str | None = None,
                  stream: bool | None = None, against: str = "transformers") -> Report:
    """Our model against a reference: transformers (live), llama.cpp (a GGUF file), or a recorded file.

    At float16 / bfloat16 the reference also runs in that dtype, and ours is judged against the
    reference's own error (``verify.LOW_PRECISION_FACTOR``). ``stream``: run both models one block
    at a time (``gptconv.streaming``); by default, when they would not fit in memory side by side.
    """
    if against not in REFERENCES:
        raise GptconvError(f"--against '{against}': choose {' or '.join(REFERENCES)}")
    dt = parse_dtype(dtype)
    low = dt != torch.float32
    name = str(dt).removeprefix("torch.")
    src = open_source(source, revision)
    if against == "llama.cpp":
        if reference_file is not None:
            raise GptconvError("--reference and --against llama.cpp: choose one reference")
        if low:
            raise GptconvError("verify --against llama.cpp runs in float32 (llama.cpp has no float16 / bfloat16 "
                               "model to compare with ours); verify --dtype float16 / bfloat16 against transformers")
        from .llamacpp import verify_gguf
        return verify_gguf(src, load_source(src, dt), _inputs(src, length, seed))
    if reference_file is not None:
        model = load_source(src, dt)
        inputs, runs, meta = read_reference(Path(reference_file))
        if meta.get("arch") != src.arch:
            raise where(reference_file, f"records a '{meta.get('arch')}' model, the source is '{src.arch}'")
        if low and name not in runs:
            raise where(reference_file, f"records no {name} run of the reference; record one with "
                                        f"`gptconv reference --dtype {name}`")
        return compare(model, inputs, lambda n, ids: runs["float32"][n], source, f"recorded: {reference_file}",
                       reference_at_dtype=(lambda n, ids: runs[name][n]) if low else None)
    if stream is None:
        stream = src.format == "hf" and _too_big_for_two(src, dt)
    if stream:
        src = open_source(source, revision, backend="stream")  # each block's tensors unmapped when dropped
    model = load_source(src, dt, streamed=stream)
    hf = transformers_model(src, torch.float32, streamed=stream)  # an fp32 folder in fp32: weights in memory once
    hf_low = transformers_model(src, dt, streamed=stream) if low else None
    inputs = _inputs(src, length, seed)
    import transformers
    run = lambda m: lambda n, ids: reference_steps(m, src.arch, src.config.n_layers, ids)  # noqa: E731
    runs = "fp32" + (f" and {name}" if low else "")
    report = compare(model, inputs, run(hf), source,
                     f"transformers {transformers.__version__} ({runs}, eager{', streamed' if stream else ''})",
                     reference_at_dtype=run(hf_low) if low else None)
    if src.format == "gguf":  # the reference runs on our reading of the file's metadata: check it
        misread = gguf_config_disagreements(src)
        report.notes += misread
        report.passed = report.passed and not misread
    return report


def _too_big_for_two(src: Source, dtype: torch.dtype) -> bool:
    """Would our model (in ``dtype``) and the references (fp32, and ``dtype`` when it is not fp32) together
    take over half the free memory? From an fp32 folder, verified in fp32, ours and the fp32
    reference share one copy of the weights."""
    n = sum(math.prod(t.shape) for t in src.tensors.values())
    shared = src.format == "hf" and dtype == torch.float32 and set(src.stored_types.values()) == {"float32"}
    low = 0 if dtype == torch.float32 else dtype.itemsize
    return n * (dtype.itemsize + (0 if shared else 4) + low) > 0.5 * _available_memory()


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def record_reference(source: str, out: Path, length: int | None = None, seed: int = 0,
                     revision: str | None = None, dtype: str = "float32", force: bool = False) -> Path:
    """Write transformers' outputs on the fixed inputs to ``out`` (safetensors) for a later verify:
    its float32 run, and its run in ``dtype`` too when that is float16 or bfloat16. An existing
    ``out`` is replaced only with ``force``."""
    import transformers
    check_output(out, force)  # before the runs
    src = open_source(source, revision)
    inputs = _inputs(src, length, seed)
    runs = {}
    for dt in dict.fromkeys([torch.float32, parse_dtype(dtype)]):
        hf = transformers_model(src, dt)
        runs[str(dt).removeprefix("torch.")] = {name: reference_steps(hf, src.arch, src.config.n_layers, ids)
                                                for name, ids in inputs.items()}
        del hf
    save_reference(Path(out), runs, inputs, {"arch": src.arch, "source": str(source),
                                             "transformers": transformers.__version__}, force)
    return Path(out)


def _inputs(src: Source, length: int | None, seed: int) -> dict:
    """The fixed prompts and the seeded random ids both sides run."""
    return parity_inputs(tokenizer_or_none(src), src.config.vocab_size, _length(src, length), seed)


def _length(src: Source, length: int | None) -> int:
    """Random-input length: the full context by default, capped at 1024 positions."""
    limit = src.config.context_length
    length = length or min(limit, 1024)
    if not 0 < length <= limit:
        raise GptconvError(f"--length {length}: the model has {limit} positions")
    return length


@dataclass
class Inspection:
    path: Path
    kind: str
    config: dict | None
    metadata: dict
    tensors: list[tuple[str, str, tuple[int, ...]]]  # (name, dtype, shape)


def inspect_path(path: Path) -> Inspection:
    """Tensors (name, dtype, shape), metadata and config of a file or checkpoint folder."""
    path = Path(path)
    if path.is_dir():
        ckpt = open_hf_folder(path)
        infos, kind, config, meta = ckpt.tensors, "hf-folder", ckpt.config, {}
    elif path.suffix == ".safetensors":
        infos, kind, config = read_safetensors(path), "safetensors", None
        from safetensors import safe_open
        meta = safe_open(str(path), framework="pt").metadata() or {}
    elif path.suffix == ".gguf":
        from .sources.gguf_file import open_gguf
        g = open_gguf(path)
        meta = {k: _short(f) for k, f in g.fields.reader.fields.items() if not k.startswith("GGUF.")}
        tensors = [(n, g.stored_types[n], i.shape) for n, i in sorted(g.tensors.items())]
        return Inspection(path, "gguf", None, meta, tensors)
    elif path.suffix in (".bin", ".pt", ".pth"):
        infos, kind, config, meta = read_torch_bin(path), "pytorch", None, {}
    elif not path.exists():
        raise where(path, "no such file or folder")
    else:
        raise where(path, "unknown kind of file (expected a folder, .safetensors or .bin)")
    tensors = [(n, str(i.dtype).removeprefix("torch."), i.shape) for n, i in sorted(infos.items())]
    return Inspection(path, kind, config, meta, tensors)


def _short(field) -> object:
    """A GGUF metadata value for display: long arrays (vocabularies, merges) as their length."""
    value = field.contents()
    if isinstance(value, list) and len(value) > 8:
        return f"[{len(value):,} items]"
    return value
