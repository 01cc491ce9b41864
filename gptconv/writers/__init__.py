"""Export: a checkpoint → an HF-layout safetensors folder or a GGUF file (``hf_folder.py``,
``gguf_file.py``), tensor by tensor (``tensors.py``).

Streamed and atomic: no model is built; each tensor is read from the source, converted (inverse key
map, narrowing checks, cast) and written, into a hidden temporary name beside the destination that
is moved into place only when complete (``gptconv.output``). An existing destination is refused
unless ``force``.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .. import memory
from ..errors import GptconvError, NoTokenizer, where
from ..loader import open_source
from ..output import atomic_output, check_output, identity
from ..sources.hf_folder import read_json_object
from ..tokenizer import config_chat_template, load_tokenizer
from .gguf_file import tensor_types, type_choices, write_gguf
from .hf_folder import write_hf_folder, written_by_export
from .tensors import (DTYPE_SYNONYMS, EXPORT_DTYPES, LLAMA_QUANTS, ExportedFile, ExportSummary, Narrowing,
                      TensorChoice, Weights)

SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size


def export(source: str | Path, out: str | Path, format: str = "safetensors", dtype: str = "f32",
           max_shard_bytes: int = SHARD_BYTES, force: bool = False, clamp: bool = False,
           revision: str | None = None,
           on_tensor: Callable[[int, int], None] = lambda done, total: None) -> ExportSummary:
    """Write ``source`` as an HF folder (``format="safetensors"``, shards of at most
    ``max_shard_bytes``) or a GGUF file (``format="gguf"``). ``on_tensor(done, total)``: progress."""
    if format not in ("safetensors", "gguf"):
        raise GptconvError(f"--format '{format}': choose safetensors or gguf")
    dtype = DTYPE_SYNONYMS.get(str(dtype).lower(), str(dtype).lower())
    if dtype not in EXPORT_DTYPES and dtype not in LLAMA_QUANTS:
        raise GptconvError(f"--dtype '{dtype}': choose one of {', '.join([*EXPORT_DTYPES, *LLAMA_QUANTS])}")
    if (dtype == "q8_0" or dtype in LLAMA_QUANTS) and format != "gguf":
        raise GptconvError(f"--dtype {dtype} exists only in GGUF")
    if dtype in LLAMA_QUANTS:
        from ..llamacpp import library
        library(f"exporting {dtype} (llama.cpp's quantizer)")  # a missing extra fails before any work
    if max_shard_bytes <= 0:
        raise GptconvError(f"max_shard_bytes {max_shard_bytes}: must be positive")
    out = Path(out)
    kind = "folder" if format == "safetensors" else "file"
    writes = written_by_export if kind == "folder" else None  # the writer knows its own file names
    check_output(out, force, kind, writes=writes)  # before loading anything
    seen = identity(out)  # what --force may replace: what is there now, not what appears meanwhile
    src = open_source(source, revision, backend="per-tensor")  # each tensor mapped on its own, unmapped when freed
    _check_memory(src, dtype)
    weights = Weights.of(src)
    weights.on_tensor = on_tensor
    tokenizer = None
    if format == "gguf" or src.format != "hf":  # an HF folder's own tokenizer files are copied as they are
        try:
            tokenizer = load_tokenizer(src)
        except NoTokenizer:  # none at all: an HF folder goes without; a GGUF file cannot (below)
            pass
    narrow = Narrowing(src.path, clamp)
    with atomic_output(out, force, kind, keep=src.read_from(), writes=writes, seen=seen) as tmp, _threads_but_one():
        if format == "safetensors":
            files = write_hf_folder(weights, src, tokenizer, tmp, EXPORT_DTYPES[dtype], max_shard_bytes, narrow)
        else:
            if tokenizer is None:
                raise where(src.path, "has no tokenizer, which a GGUF file must carry")
            if dtype in LLAMA_QUANTS:  # the types llama.cpp's quantizer chose: read back from the file
                files = [_quantized(weights, src, tokenizer, tmp, dtype, narrow, out.name)]
                types = tensor_types(tmp)
            else:
                file, types = write_gguf(weights, src, tokenizer, tmp, dtype, narrow, out.name)
                files = [file]
    if format == "safetensors":
        return ExportSummary(str(source), out, format, dtype, files)
    choices = [TensorChoice(*c) for c in type_choices(types, dtype)]
    return ExportSummary(str(source), out, format, dtype, files, dict(Counter(c.type for c in choices)), choices,
                         notes=_template_notes(src, tokenizer))


def _template_notes(src, tokenizer) -> list[str]:
    """Which chat template a GGUF got where the folder holds two: transformers renders chat_template.jinja's,
    llama.cpp's converter writes tokenizer_config.json's."""
    if src.format != "hf" or not os.path.lexists(src.path / "chat_template.jinja"):
        return []
    other = config_chat_template(read_json_object(src.path / "tokenizer_config.json"))
    if other is None or other == tokenizer.chat_template:
        return []
    return ["tokenizer.chat_template is chat_template.jinja's, the one transformers renders; tokenizer_config.json "
            "holds another, which llama.cpp's converter would write"]


def _check_memory(src, dtype: str) -> None:
    """Refuse in one line an export whose largest tensor, read, converted and written behind, would not fit."""
    stored = 4 if src.format == "gguf" else max((t.dtype.itemsize for t in src.tensors.values()
                                                 if t.dtype.is_floating_point), default=4)
    out = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 1}.get(dtype, 4)  # a llama.cpp quant: from an f32 / 16-bit file
    memory.check(memory.export_need(src.name, memory.Shape.of(src.config), stored, out))


def _quantized(weights: Weights, src, tokenizer, tmp: Path, dtype: str, narrow: Narrowing, name: str) -> ExportedFile:
    """A full-precision GGUF first (beside the output, under its temporary name), then llama.cpp's own
    quantizer from it: each tensor's type follows llama.cpp's rules for that mix (the head at Q6_K,
    attn_v and ffn_down at more bits in the _M mixes, 1-D tensors F32, rows not a multiple of the block
    fall back). The intermediate holds the source's own precision — bf16 or f16 for a checkpoint
    stored so, half an f32 file on disk — else f32; the quantizer reads every value exactly either way."""
    from ..llamacpp import quantize_file
    from ..output import sha256_file
    exact = {torch.bfloat16: "bf16", torch.float16: "f16"}.get(weights.dtype, "f32")
    intermediate = tmp.with_name(f"{tmp.name}.{exact}")
    try:
        write_gguf(weights, src, tokenizer, intermediate, exact, narrow, name)
        quantize_file(intermediate, tmp, LLAMA_QUANTS[dtype])
    finally:
        intermediate.unlink(missing_ok=True)
    return ExportedFile(name, tmp.stat().st_size, sha256_file(tmp))


@contextlib.contextmanager
def _threads_but_one() -> Iterator[None]:
    """Leave a core to the sha256 thread: torch's parallel loops wait for their slowest thread, and
    one sharing a core with the hasher made a 16 GB export three times slower (131 s against 45 s)."""
    n = torch.get_num_threads()
    torch.set_num_threads(max(1, n - 1))
    try:
        yield
    finally:
        torch.set_num_threads(n)



__all__ = ["EXPORT_DTYPES", "ExportSummary", "ExportedFile", "LLAMA_QUANTS", "SHARD_BYTES", "export"]
