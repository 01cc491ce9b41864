"""What an export writes, tensor by tensor: each of our parameters under its name in the written
format (the key table read backwards, ``Weights``), converted and checked on its way out
(``Narrowing``), and the summary of what was written."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..convert.keymap import KeyMap, Plan, model_shapes
from ..errors import where
from ..models import build_empty
from ..results import Result

F16_MAX = 65504.0
# One set of dtype names everywhere (f32, f16, bf16, q8_0, …); torch's long names are synonyms
DTYPE_SYNONYMS = {"float32": "f32", "fp32": "f32", "float16": "f16", "fp16": "f16", "half": "f16", "bfloat16": "bf16"}
EXPORT_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "q8_0": None}
# GGUF types made by llama.cpp's own quantizer (llama-quantize's mixes) from an f32 GGUF we write first
LLAMA_QUANTS = {name: name.upper() for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m",
                                                "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k")}


@dataclass
class TensorChoice(Result):
    tensor: str
    type: str
    why: str


@dataclass
class ExportedFile(Result):
    name: str
    bytes: int
    sha256: str


@dataclass
class ExportSummary(Result):
    source: str
    out: Path
    format: str
    dtype: str
    files: list[ExportedFile]
    tensor_types: dict[str, int] | None = None  # GGUF: tensor type → how many tensors have it
    tensor_choices: list[TensorChoice] | None = None  # GGUF: each tensor's type and why
    check: Any = None  # export --check: a perplexity.Perplexity of the written model against the source
    notes: list[str] = field(default_factory=list)  # what the export chose where the peers differ


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
        if {src.dtype, dst.dtype} == {torch.bfloat16, torch.float16} and src.is_contiguous():
            _via_float32(dst.view(-1), src.view(-1))
        else:
            dst.copy_(src)
        return
    for i in range(0, src.shape[0], tile):
        for j in range(0, src.shape[1], tile):
            dst[i:i + tile, j:j + tile].copy_(src[i:i + tile, j:j + tile])


_PIECE = 1 << 18  # float32 elements: 1 MiB, held in a core's cache between the two conversions


def _via_float32(dst: torch.Tensor, src: torch.Tensor) -> None:
    """bfloat16 ↔ float16 through float32 (which holds either exactly: the same result), a cache-sized
    piece at a time: torch converts between the two 16-bit types directly at 0.57 G elements/s on
    one core, through a reused float32 piece at 1.9 (measured, Xeon Sapphire Rapids)."""
    piece = torch.empty(min(_PIECE, src.numel()))
    for i in range(0, src.numel(), _PIECE):
        n = min(_PIECE, src.numel() - i)
        piece[:n].copy_(src[i:i + n])
        dst[i:i + n].copy_(piece[:n])


class Stored(NamedTuple):
    """One tensor an export writes: of one of our parameters, or of several joined (fused)."""

    ours: tuple[str, ...]  # our parameter names, in the order the join takes them
    name: str  # its name in the written format
    join: Callable[[list[torch.Tensor], Any], torch.Tensor]  # the key table's inverse
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
    on_tensor: Callable[[int, int], None] = lambda done, total: None  # progress: tensors written of all

    @classmethod
    def of(cls, src: Any) -> Weights:
        shapes = model_shapes(build_empty(src.config))
        plan = src.plan(shapes)  # the strict ledger, checked before anything is written
        return cls(src.config, shapes, plan, _load_dtype(src))

    def stored_as(self, keymap: KeyMap) -> list[Stored]:
        """Every parameter's name, transform and shape in the written format, read off the same
        key table as import."""
        stored = []
        for inv in keymap.inverse(list(self.shapes), self.config):
            written = inv.join([torch.empty(self.shapes[p], device="meta") for p in inv.parts], self.config)
            stored.append(Stored(inv.parts, inv.name, inv.join, tuple(written.shape)))
        return stored

    def written(self, stored: list[Stored]) -> Iterator[torch.Tensor]:
        """Each of ``stored`` in its written layout, read from the source one at a time; the
        source tensor is dropped before the next is read (its pages unmapped), so a caller keeps
        no reference past its loop body."""
        for n, s in enumerate(stored):
            tensor = s.join([self.plan.tensor(p, self.dtype) for p in s.ours], self.config)
            yield tensor
            del tensor
            self.on_tensor(n + 1, len(stored))


def _load_dtype(src) -> torch.dtype:
    """Load in the source's own precision (a bf16 checkpoint stays bf16 in memory, its MXFP4 experts too,
    which bfloat16 holds exactly), else float32."""
    stored = {"bfloat16" if s == "MXFP4" else "float32" if s == "FP8" else s for s in src.stored_types.values()}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        if stored == {name}:
            return dtype
    return torch.float32
