"""Export: a checkpoint → an HF-layout safetensors folder or a GGUF file (``hf_folder.py``,
``gguf_file.py``), tensor by tensor (``tensors.py``).

Streamed and atomic: no model is built; each tensor is read from the source, converted (inverse key
map, narrowing checks, cast) and written, into a hidden temporary name beside the destination that
is moved into place only when complete (``gptconv.output``). An existing destination is refused
unless ``force``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import GptconvError, NoTokenizer, where
from ..loader import open_source
from ..output import atomic_output, check_output
from ..tokenizer import load_tokenizer
from .gguf_file import write_gguf
from .hf_folder import write_hf_folder
from .tensors import EXPORT_DTYPES, ExportedFile, ExportSummary, Narrowing, Weights

SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size


def export(source: str | Path, out: str | Path, format: str = "safetensors", dtype: str = "f32",
           max_shard_bytes: int = SHARD_BYTES, force: bool = False, clamp: bool = False,
           revision: str | None = None) -> ExportSummary:
    """Write ``source`` as an HF folder (``format="safetensors"``, shards of at most
    ``max_shard_bytes``) or a GGUF file (``format="gguf"``)."""
    if format not in ("safetensors", "gguf"):
        raise GptconvError(f"--format '{format}': choose safetensors or gguf")
    if dtype not in EXPORT_DTYPES:
        raise GptconvError(f"--dtype '{dtype}': choose one of {', '.join(EXPORT_DTYPES)}")
    if dtype == "q8_0" and format != "gguf":
        raise GptconvError("--dtype q8_0 exists only in GGUF")
    if max_shard_bytes <= 0:
        raise GptconvError(f"max_shard_bytes {max_shard_bytes}: must be positive")
    out = Path(out)
    kind = "folder" if format == "safetensors" else "file"
    check_output(out, force, kind)  # before loading anything
    src = open_source(source, revision, backend="per-tensor")  # each tensor mapped on its own, unmapped when freed
    weights = Weights.of(src)
    tokenizer = None
    if format == "gguf" or src.format != "hf":  # an HF folder's own tokenizer files are copied as they are
        try:
            tokenizer = load_tokenizer(src)
        except NoTokenizer:  # none at all: an HF folder goes without; a GGUF file cannot (below)
            pass
    narrow = Narrowing(src.path, clamp)
    with atomic_output(out, force, kind, keep=(src.path,)) as tmp, _threads_but_one():
        if format == "safetensors":
            files = write_hf_folder(weights, src, tokenizer, tmp, EXPORT_DTYPES[dtype], max_shard_bytes, narrow)
        else:
            if tokenizer is None:
                raise where(src.path, "has no tokenizer, which a GGUF file must carry")
            files = [write_gguf(weights, src, tokenizer, tmp, dtype, narrow, out.name)]
    return ExportSummary(str(source), out, format, dtype, files)


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



__all__ = ["EXPORT_DTYPES", "ExportSummary", "ExportedFile", "SHARD_BYTES", "export"]
