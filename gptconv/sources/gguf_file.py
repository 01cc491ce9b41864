"""GGUF (llama.cpp) files as a source: metadata and tensors, read by the ``gguf`` package.

``GGUFReader`` maps the file and walks its metadata; a hostile file could make it loop or allocate,
so the header's counts are checked against the file's size first (``check_header``) and every read
and array count against the bytes left (``CheckedReader``). Its tensor table is checked before the
reader computes anything from it (``check_tensor_table``): GGUFReader adds offsets in numpy's uint64,
which wraps. Tensors are dequantized to float32 by ``gguf.quants`` when loaded. What the metadata
means for a model is ``convert/``'s business.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType, GGUFReader, GGUFValueType, Keys
from gguf.quants import dequantize

from ..convert.keymap import TensorInfo
from ..errors import where
from .files import UNLIMITED, regular_file

_REQUIRED = object()


class GGUFFields:
    """Typed access to a GGUF file's metadata, naming the file and key in every error."""

    def __init__(self, reader: GGUFReader, path: Path) -> None:
        self.reader, self.path = reader, path
        self.arch = self.get(Keys.General.ARCHITECTURE, str)

    def get(self, key: str, kind: type, default: Any = _REQUIRED) -> Any:
        key = key.format(arch=getattr(self, "arch", ""))
        field = self.reader.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise where(self.path, f"missing metadata key '{key}'")
            return default
        try:
            value = field.contents()
        except Exception as e:  # a field whose bytes do not decode
            raise where(self.path, f"metadata key '{key}' cannot be read ({e})") from None
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise where(self.path, f"metadata key '{key}' is {type(value).__name__}, expected {kind.__name__}")
        return value


@dataclass
class GGUFFile:
    """A GGUF file opened: its metadata, and its tensors listed (each read and dequantized only when
    loaded), whatever its architecture; ``convert/`` makes a config and a key map of them."""

    path: Path
    fields: GGUFFields
    tensors: dict[str, TensorInfo]
    stored_types: dict[str, str]  # tensor name → GGML type (Q4_1, F32, …)

    def raw(self, name: str, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, GGMLQuantizationType]:
        """Rows ``start:stop`` of tensor ``name`` as stored (GGUFReader's layout: its dtype, bytes for a
        quantized type), read alone from the file, and its type: what a dequantizer takes."""
        t = self._by_name[name]
        return _read(self.path, t, start, stop), t.tensor_type

    @property
    def _by_name(self) -> dict[str, Any]:
        if "_tensor_table" not in self.__dict__:
            self.__dict__["_tensor_table"] = {t.name: t for t in self.fields.reader.tensors}
        return self.__dict__["_tensor_table"]


def check_header(path: Path) -> None:
    """Refuse, before GGUFReader walks the file, counts that the file's size cannot hold.

    The fixed header is magic, version (u32), tensor count and metadata count (u64 each). Every
    tensor entry takes at least 24 bytes and every metadata entry at least 12, so larger counts
    are lies that would only make a reader loop or allocate.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as e:
        raise where(path, e.strerror or str(e)) from None
    if len(head) < 24:
        raise where(path, f"not a GGUF file: {size} bytes, shorter than a GGUF header")
    magic, version, n_tensors, n_kv = struct.unpack("<IIQQ", head)
    if magic != GGUF_MAGIC:
        raise where(path, f"not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
    if version not in (2, 3):
        raise where(path, f"GGUF version {version} is not supported (2 or 3)")
    if n_tensors * 24 > size or n_kv * 12 > size:
        raise where(path, f"header claims {n_tensors:,} tensors and {n_kv:,} metadata entries, "
                          f"more than a {size:,}-byte file can hold")


class TableError(ValueError):
    """A tensor table that does not describe the file's data; its message names the tensor."""


def check_tensor_table(fields: list[Any], data_start: int, alignment: int, file_size: int) -> None:
    """Refuse, from the tensor table's raw entries and before GGUFReader reads anything there, a table
    that does not describe the file's data section (which starts at ``data_start``) as llama.cpp
    requires: each tensor's data right after the previous one's, padded to ``alignment``, in table order
    (gguf.cpp: "tensor '…' has offset …, expected …"), and inside the file.

    All arithmetic is in Python ints: GGUFReader adds each offset to the data section's start in
    numpy's uint64, so an offset of 2^64 - 32 wrapped to a place inside the header, past every check
    made after it, and its bytes were read as weights (transformers reads the same wrapped bytes, so
    verify passed). The layout rule is what catches a type or shape that does not match the data: an
    F32 tensor relabelled BF16, or two tensors given one offset, were read here (half the tensor; the
    same bytes twice) and refused by llama.cpp. Each entry's parts: name length, name, dimension
    count, dimensions (innermost first), type, offset.
    """
    data_size = file_size - data_start
    expected = 0  # where llama.cpp expects the next tensor's data: the previous ones' padded sizes summed
    regions: list[tuple[str, str, int, int]] = []  # each tensor so far: name, "TYPE [shape]", start, end
    names: set[str] = set()  # a set: a file may list millions of tensors
    for field in fields:
        name, (n_dims,), dims, (raw_type,), (offset,) = field.name, *(field.parts[i] for i in (2, 3, 4, 5))
        dims, offset = [int(d) for d in dims], int(offset)
        if name in names:
            raise TableError(f"tensor '{name}' appears twice")
        names.add(name)
        try:
            kind = GGMLQuantizationType(int(raw_type))
        except ValueError:
            raise TableError(f"tensor '{name}' has an unknown type ({int(raw_type)})") from None
        block, block_bytes = GGML_QUANT_SIZES[kind]
        shape = list(reversed(dims))  # as torch lists it, outermost first
        if int(n_dims) > 4 or any(d >= 2**63 for d in dims) or math.prod(dims) >= 2**63:
            raise TableError(f"tensor '{name}' has the shape {shape}, more than GGUF allows (4 dimensions, "
                             f"fewer than 2^63 elements)")
        if (dims[0] if dims else 1) % block:
            raise TableError(f"tensor '{name}' of type {kind.name} has rows of {dims[0] if dims else 1} "
                             f"elements, not a multiple of its block ({block})")
        size = math.prod(dims) // block * block_bytes
        what = f"{kind.name} {shape}"
        if offset + size > data_size:
            raise TableError(f"tensor '{name}' ({what}, {size:,} bytes at data offset {offset:,}) "
                             f"lies outside the file's tensor data ({max(data_size, 0):,} bytes)")
        if offset % alignment:
            raise TableError(f"tensor '{name}' starts at a data offset not aligned to {alignment} bytes ({offset:,})")
        if offset < expected:  # inside an earlier tensor's data (aligned, so not in its padding alone)
            other, other_what, start, end = next(
                (r for r in reversed(regions) if r[2] <= offset < r[3]), regions[-1])
            raise TableError(f"tensor '{name}' ({what}) at data offset {offset:,} overlaps tensor '{other}' "
                             f"({other_what}, bytes {start:,} to {end:,}); llama.cpp expects it at {expected:,}")
        if offset > expected:
            if not regions:
                raise TableError(f"tensor '{name}', the first, starts at data offset {offset:,}, not 0; "
                                 f"llama.cpp expects 0")
            other, other_what, start, end = regions[-1]
            raise TableError(f"tensor '{name}' starts at data offset {offset:,}, {offset - expected:,} bytes past the "
                             f"end of tensor '{other}' ({other_what}: {end - start:,} bytes, padded to {alignment}): "
                             f"a type or shape that does not match the data, or tensors out of order; llama.cpp "
                             f"expects it at {expected:,}")
        regions.append((name, what, offset, offset + size))
        expected = offset + -(-size // alignment) * alignment


_BULK = object()  # the last part of an array read in one part (CheckedReader._bulk_array)


class BulkField:
    """A metadata array read in one part: what ``gguf.ReaderField`` gives (``contents()``, ``parts``,
    ``types``), without a Python object per item until ``contents`` is asked for."""

    def __init__(self, offset: int, name: str, parts: list, types: list, data: np.ndarray) -> None:
        self.offset, self.name, self.types = offset, name, types
        self._file = data
        parts = parts[:-1]
        if types[-1] == GGUFValueType.STRING:
            *parts, self._strings = parts  # the items' starts and lengths, not a part of the file
        self.parts, self.data = parts, [len(parts) - 1]  # the key's 3 parts, the array's 2, its items

    def contents(self, index_or_slice: int | slice = slice(None)) -> Any:
        if self.types[-1] != GGUFValueType.STRING:
            values = self.parts[-1][index_or_slice]
            return values.tolist()
        starts, lengths = (a[index_or_slice] for a in self._strings)
        buf = memoryview(self._file)
        if isinstance(index_or_slice, int):
            return str(buf[starts:starts + lengths], "utf-8")
        return [str(buf[s:s + n], "utf-8") for s, n in zip(starts.tolist(), lengths.tolist())]


class CheckedReader(GGUFReader):
    """GGUFReader, refusing to read past the end of the file. Its reads past the end return empty
    arrays, so an array whose count is 2^40 made it append empty parts for ever (3.5 GB in 30 s):
    every read must fit in the file, and every array's count times its least item size in the bytes
    left (a string takes at least its 8-byte length, a nested array its 12-byte header)."""

    LEAST_ITEM = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}
    # No key llama.cpp defines holds arrays of arrays, and the reader builds Python objects for each
    # item (a 12 MB file of a million empty arrays took 42 s and 1.5 GB): a few are allowed, not more.
    MOST_NESTED = 1024

    def _get(self, offset, dtype, count=1, override_order=None, **kwargs):
        if type(self.data) is np.memmap:
            # the same mapping as a plain array: numpy's memmap subclass runs Python code on every slice, and
            # the reader takes one or two per item (a 151,936-token vocabulary's metadata: 12 s → 4 s)
            self.data = self.data.view(np.ndarray)
        end = int(offset) + int(np.dtype(dtype).itemsize) * int(count)
        if end > len(self.data):
            raise ValueError(f"a read at byte {int(offset):,} runs past the end of the file ({len(self.data):,} bytes)")
        return super()._get(offset, dtype, count, override_order, **kwargs)

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type == GGUFValueType.ARRAY:
            item = GGUFValueType(int(self._get(orig_offs, np.uint32)[0]))
            count = int(self._get(orig_offs + 4, np.uint64)[0])
            least = self.LEAST_ITEM.get(item) or np.dtype(self.gguf_scalar_to_np[item]).itemsize
            left = len(self.data) - orig_offs - 12
            if count * least > left:
                raise ValueError(f"an array of {count:,} {item.name} items at byte {orig_offs:,}, more than the "
                                 f"{left:,} bytes left can hold")
            if item == GGUFValueType.ARRAY and count > self.MOST_NESTED:
                raise ValueError(f"an array of {count:,} arrays at byte {orig_offs:,}; no GGUF key holds more "
                                 f"than {self.MOST_NESTED:,}")
        if raw_type == GGUFValueType.ARRAY and item != GGUFValueType.ARRAY:
            return self._bulk_array(orig_offs, item, count)
        return super()._get_field_parts(orig_offs, raw_type)

    def _bulk_array(self, offs: int, item: GGUFValueType, count: int):
        """An array of scalars or strings as one part (the reader made two numpy views per item, ~1.5 KB
        of RAM per vocabulary entry): scalars are one view of the mapped bytes, strings one view of their
        bytes plus each item's start and length (16 bytes an item, never more than the 8-byte length
        and its text take in the file). ``_push_field`` makes these a ``BulkField``."""
        head = [self._get(offs, np.uint32), self._get(offs + 4, np.uint64)]
        start = offs + 12
        if item != GGUFValueType.STRING:
            values = self._get(start, self.gguf_scalar_to_np[item], count)
            return 12 + int(values.nbytes), [*head, values, _BULK], [], [GGUFValueType.ARRAY, item]
        order = np.dtype(np.uint64).newbyteorder(self.byte_order).str[0]
        length, buf, size = struct.Struct(order + "Q").unpack_from, memoryview(self.data), len(self.data)
        starts, lengths = np.empty(count, np.int64), np.empty(count, np.int64)
        at = start
        for i in range(count):
            if at + 8 > size:
                raise ValueError(f"string {i:,} of the array at byte {offs:,} runs past the end of the file")
            (n,) = length(buf, at)
            if n > size - at - 8:
                raise ValueError(f"string {i:,} of the array at byte {offs:,} is {n:,} bytes, past the end "
                                 f"of the file")
            starts[i], lengths[i] = at + 8, n
            at += 8 + n
        blob = self._get(start, np.uint8, at - start)
        return at - offs, [*head, blob, (starts, lengths), _BULK], [], [GGUFValueType.ARRAY, item]

    def _push_field(self, field, skip_sum=False):
        if field.parts[-1] is _BULK:
            field = BulkField(field.offset, field.name, field.parts, field.types, self.data)
        return super()._push_field(field, skip_sum)

    def _build_tensors(self, start_offs, fields):
        check_tensor_table(fields, int(start_offs), int(self.alignment), len(self.data))
        return super()._build_tensors(start_offs, fields)


def read_fields(path: Path) -> GGUFFields:
    """A GGUF file's metadata (its tensors listed, none read), whatever its architecture."""
    path = regular_file(Path(path), UNLIMITED)  # a FIFO would block GGUFReader for ever
    check_header(path)
    try:
        # numpy's warnings off while GGUFReader computes: its uint64 arithmetic printed "RuntimeWarning:
        # overflow encountered in scalar add" after a wrap; the table is checked in Python ints first
        # (check_tensor_table), so such a wrap no longer decides anything, and must not print
        with np.errstate(all="ignore"):
            reader = CheckedReader(path, "r")
    except FileNotFoundError:
        raise where(path, "no such file") from None
    except TableError as e:
        raise where(path, f"not a readable GGUF file: {e}") from None
    except Exception as e:  # GGUFReader raises ValueError, struct.error, IndexError… on a corrupt file
        raise where(path, f"not a readable GGUF file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return GGUFFields(reader, path)


def open_gguf(path: Path) -> GGUFFile:
    """The file's metadata and tensors, each tensor's data checked to lie inside the file, where
    llama.cpp expects it (``check_tensor_table``)."""
    fields = read_fields(path)
    path = fields.path
    reader = fields.reader
    tensors, types = {}, {}
    for t in reader.tensors:  # laid out as llama.cpp requires, inside the file (check_tensor_table)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml lists dims innermost first
        tensors[t.name] = TensorInfo(shape, torch.float32, _loader(path, t, shape), rows=_row_reader(path, t, shape))
        types[t.name] = t.tensor_type.name
    return GGUFFile(path, fields, tensors, types)


def _loader(path: Path, t: Any, shape: tuple[int, ...]):
    def load() -> torch.Tensor:
        return _dequantized(path, t, _read(path, t), shape)
    return load


def _row_reader(path: Path, t: Any, shape: tuple[int, ...]):
    """Rows of a 2-D tensor, read and dequantized alone (each row is whole blocks of its type)."""
    def rows(index: slice | torch.Tensor) -> torch.Tensor:
        if len(shape) != 2:
            return _loader(path, t, shape)()[index]
        if isinstance(index, slice):
            start, stop, _ = index.indices(shape[0])
            data = _read(path, t, start, stop)
            return _dequantized(path, t, data, (stop - start, shape[1]))
        ids = index.tolist()
        parts, runs = [], []
        for i in ids:  # runs of consecutive rows, each read at once
            if runs and runs[-1][1] == i:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
        for start, stop in runs:
            parts.append(_dequantized(path, t, _read(path, t, start, stop), (stop - start, shape[1])))
        return torch.cat(parts) if len(parts) != 1 else parts[0]
    return rows


def _read(path: Path, t: Any, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows ``start:stop`` of tensor ``t`` (all of it by default) as GGUFReader lays them out (its
    dtype, its shape in bytes for a quantized type), read from the file with ``pread`` into memory of
    their own: the reader's mapping of the file is never touched, so pages read for one tensor do not
    stay counted in this process's memory after it (a pass over a file larger than memory stays within
    memory)."""
    rows = t.data.shape[0] if t.data.ndim > 1 else 1
    row_bytes = int(t.n_bytes) // max(rows, 1)
    stop = rows if stop is None else stop
    n = (stop - start) * row_bytes
    buffer = np.empty(n, dtype=np.uint8)
    try:
        with open(path, "rb", buffering=0) as f:
            got = os.preadv(f.fileno(), [memoryview(buffer)], int(t.data_offset) + start * row_bytes)
    except OSError as e:
        raise where(path, f"tensor '{t.name}' cannot be read ({e.strerror or e})") from None
    if got != n:
        raise where(path, f"tensor '{t.name}' cannot be read (the file ended after {got:,} of {n:,} bytes)")
    data = buffer.view(t.data.dtype)
    return data.reshape((stop - start, *t.data.shape[1:])) if t.data.ndim > 1 else data.reshape(t.data.shape)


def _dequantized(path: Path, t: Any, data: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    try:
        # numpy's floating-point warnings off: a corrupt block scale (Inf times a quant of 0) printed
        # "RuntimeWarning: invalid value encountered in multiply" ahead of our output or our one error
        # line. The NaN or Inf it makes is judged where the weights are used: export refuses them,
        # verify reports them.
        with np.errstate(all="ignore"):
            if t.tensor_type == GGMLQuantizationType.F32:
                array = data
            elif t.tensor_type == GGMLQuantizationType.F16:
                array = data.astype(np.float32)
            else:
                array = dequantize(data, t.tensor_type)
            return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).reshape(shape)
    except (NotImplementedError, ValueError, TypeError) as e:
        raise where(path, f"tensor '{t.name}' of type {t.tensor_type.name} cannot be dequantized ({e})") from None
