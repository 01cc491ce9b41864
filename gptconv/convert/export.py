"""Export: our loaded model → an HF-layout safetensors folder or a GGUF file.

Streaming and atomic: tensors are converted (inverse key map, narrowing checks, cast) and written
one at a time, into a hidden temporary name beside the destination that is renamed into place
only when complete. An existing destination is refused unless ``force``.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..errors import GptconvError, NoTokenizer, where
from ..files import atomic_output, check_output
from .keymap import KeyMap, Plan, Transform, model_shapes

F16_MAX = 65504.0
EXPORT_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "q8_0": None}


@dataclass
class ExportedFile:
    name: str
    bytes: int
    sha256: str


@dataclass
class ExportSummary:
    source: str
    out: Path
    format: str
    dtype: str
    files: list[ExportedFile]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


class WriteBehind:
    """Writes run on one other thread, in order, one at a time: converting the next tensor overlaps
    writing this one (a 16 GB export spent half its time in each). At most two converted tensors
    are alive: the one being written and the one being made."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="gptconv-write")
        self.pending: Future | None = None

    def __call__(self, write: Callable[..., object], *args: object) -> None:
        self.wait()
        self.pending = self.pool.submit(write, *args)

    def wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()  # a failed write raises here, in the exporting thread

    def __enter__(self) -> WriteBehind:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None:
                self.wait()
        finally:
            self.pool.shutdown(wait=True)


class TailHash:
    """The sha256 of a file that is being written front to back, hashed on another thread as it
    grows (reading back what the page cache already holds), so that hashing overlaps converting
    and writing instead of following them. ``result()`` after the writer has closed the file."""

    def __init__(self, path: Path) -> None:
        self.path, self.done = path, threading.Event()
        self.sha, self.error = hashlib.sha256(), None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.path.exists() and not self.done.wait(0.005):
                pass
            with open(self.path, "rb") as f:
                while True:
                    finished = self.done.is_set()  # read before: then everything written is seen below
                    block = f.read(1 << 24)
                    if block:
                        self.sha.update(block)  # hashlib lets go of the GIL for large blocks
                    elif finished:
                        return
                    else:
                        self.done.wait(0.005)
        except OSError as e:
            self.error = e

    def result(self) -> str:
        self.stop()
        if self.error is not None:
            raise where(self.path, f"cannot be read back to hash it ({self.error})")
        return self.sha.hexdigest()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def __enter__(self) -> TailHash:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()  # on failure too: no thread is left waiting for a file that will not grow


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB', '1000000' → bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*", text, re.IGNORECASE)
    if not m:
        raise GptconvError(f"--max-shard-size '{text}': expected a size like 5GB or 500MB")
    unit = (m.group(2) or "").upper().rstrip("B")
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
    size = int(float(m.group(1)) * scale)
    if size <= 0:
        raise GptconvError(f"--max-shard-size '{text}' must be positive")
    return size


class Narrowing:
    """Converts every tensor on its way out, in chunks, checking it; names the tensor in every error.

    NaN or Inf in a tensor is an error; so is a value past the float16 range when writing float16,
    unless ``clamp``. Chunks keep the peak memory of a conversion at the output tensor plus one chunk.
    """

    CHUNK = 1 << 24  # elements at a time: 64 MiB of float32

    def __init__(self, origin: object, clamp: bool) -> None:
        self.origin, self.clamp = origin, clamp

    def __call__(self, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``t`` as a contiguous ``dtype`` tensor, converted and checked a block of rows at a time
        (a transposed view is transposed in the same pass)."""
        same = t.dtype == dtype and t.is_contiguous()
        out = t if same else torch.empty(t.shape, dtype=dtype)
        if t.numel() == 0:
            return out
        rows = t.reshape(1, -1) if t.dim() < 2 else t
        dst_rows = out.view(rows.shape)
        step = max(1, self.CHUNK // rows[0].numel())
        for i in range(0, rows.shape[0], step):
            part, dst = rows[i:i + step], dst_rows[i:i + step]
            if not same:
                _copy(dst, part)  # converts, and transposes a transposed view, in one pass
            lo, hi = torch.aminmax(dst)  # NaN propagates and ±Inf shows: all finite iff both ends are
            if not (torch.isfinite(lo) and torch.isfinite(hi)):
                fixed = self._out_of_range(name, t, part, dtype)  # raises unless clamping
                dst.copy_(fixed)
        return out

    def _out_of_range(self, name: str, whole: torch.Tensor, part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if not torch.isfinite(part).all():
            raise where(self.origin, f"tensor '{name}' holds NaN or Inf values; refusing to export it")
        # finite in the source, infinite as float16: past its range
        if not self.clamp:
            peak = max(c.abs().max().item() for c in whole.reshape(-1).split(self.CHUNK))
            raise where(self.origin, f"tensor '{name}' has |w| = {peak:g} > {F16_MAX:g}, the float16 maximum; "
                                     "export as bf16/f32, or pass --clamp to clip it")
        return part.clamp(-F16_MAX, F16_MAX).to(dtype)


def _copy(dst: torch.Tensor, src: torch.Tensor, tile: int = 256) -> None:
    """``dst.copy_(src)``; a transposed ``src`` (GPT-2's Conv1D weights) is copied in tile × tile
    squares. Whole, each output row gathers one element from every source row, a power-of-two stride
    apart: GPT-2's 768 × 3072 ran at 0.16 G elements/s against 0.8 in tiles (4.3 for a plain copy)."""
    if src.dim() != 2 or src.stride(-1) == 1:
        dst.copy_(src)
        return
    for i in range(0, src.shape[0], tile):
        for j in range(0, src.shape[1], tile):
            dst[i:i + tile, j:j + tile].copy_(src[i:i + tile, j:j + tile])


class Stored(NamedTuple):
    """One of our parameters as an export writes it."""

    ours: str  # our parameter name
    name: str  # its name in the written format
    transform: Transform  # the key table's transform, applied inverse on the way out
    shape: tuple[int, ...]  # as written


@dataclass
class Weights:
    """Our model's parameters as export reads them: every name and shape up front (the writers
    lay out their headers first), then the tensors one at a time. Nothing is loaded as a model:
    each tensor is read, converted, written and freed in turn."""

    config: Any
    shapes: dict[str, tuple[int, ...]]  # our name → shape, in the model's order
    plan: Plan
    dtype: torch.dtype  # the source's own precision (a bf16 checkpoint stays bf16), else float32

    @classmethod
    def of(cls, src: Any) -> Weights:
        from ..models import build_empty
        shapes = model_shapes(build_empty(src.config))
        plan = src.plan(shapes)  # the strict ledger, checked before anything is written
        return cls(src.config, shapes, plan, _load_dtype(src))

    def stored_as(self, keymap: KeyMap) -> list[Stored]:
        """Every parameter's name, transform and shape in the written format, read off the same
        key table as import."""
        stored = []
        for ours, shape in self.shapes.items():
            name, transform = keymap.source_name(ours)
            written = transform.inverse(torch.empty(shape, device="meta"), self.config)
            stored.append(Stored(ours, name, transform, tuple(written.shape)))
        return stored

    def written(self, stored: list[Stored]) -> Iterator[torch.Tensor]:
        """Each of ``stored`` in its written layout, read from the source one at a time; the
        source tensor is dropped before the next is read (its pages unmapped), so a caller keeps
        no reference past its loop body."""
        for s in stored:
            tensor = self.plan.tensor(s.ours, self.dtype)
            yield s.transform.inverse(tensor, self.config)
            del tensor


def export(source: str, out: Path, format: str = "safetensors", dtype: str = "f32", max_shard_size: str = "5GB",
           force: bool = False, clamp: bool = False, revision: str | None = None) -> ExportSummary:
    """Write ``source`` as an HF folder (``format="safetensors"``) or a GGUF file (``format="gguf"``)."""
    from ..loader import open_source
    from ..tokenizer import load_tokenizer
    if format not in ("safetensors", "gguf"):
        raise GptconvError(f"--format '{format}': choose safetensors or gguf")
    if dtype not in EXPORT_DTYPES:
        raise GptconvError(f"--dtype '{dtype}': choose one of {', '.join(EXPORT_DTYPES)}")
    if dtype == "q8_0" and format != "gguf":
        raise GptconvError("--dtype q8_0 exists only in GGUF")
    out = Path(out)
    shard_bytes = parse_size(max_shard_size)
    kind = "folder" if format == "safetensors" else "file"
    check_output(out, force, kind)  # before loading anything
    src = open_source(source, revision, backend="stream")  # each tensor mapped on its own, unmapped when freed
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
            from .hf_export import write_hf_folder
            files = write_hf_folder(weights, src, tokenizer, tmp, EXPORT_DTYPES[dtype], shard_bytes, narrow)
        else:
            from .gguf_export import write_gguf
            if tokenizer is None:
                raise where(src.path, "has no tokenizer, which a GGUF file must carry")
            files = [write_gguf(weights, src, tokenizer, tmp, dtype, narrow, out.name)]
    return ExportSummary(source, out, format, dtype, files)


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


def _load_dtype(src) -> torch.dtype:
    """Load in the source's own precision (a bf16 checkpoint stays bf16 in memory), else float32."""
    stored = set(src.stored_types.values())
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        if stored == {name}:
            return dtype
    return torch.float32
