"""A safetensors file written one tensor at a time.

safetensors' Python API (``save_file``) serializes a whole dict of tensors at once, so exporting
through it holds the model twice. This writes the same format (8-byte little-endian header
length, JSON header with dtype / shape / data_offsets, then the raw bytes) tensor by tensor; its
sha256 is taken on another thread as the file grows. Every file it writes is read back by the ``safetensors`` library in the tests.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from ..output import TailHash

DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


class SafetensorsWriter:
    """``with SafetensorsWriter(path, entries) as w: w.write(name, tensor) …; sha256 = w.close()``."""

    def __init__(self, path: Path, entries: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        """``entries``: (name, dtype, shape) of every tensor, in the order they will be written."""
        header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
        offset = 0
        self.expected: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        for name, dtype, shape in entries:
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            self.expected.append((name, dtype, tuple(shape)))
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self.file = open(path, "wb")
        self.sha = TailHash(path)
        self.file.write(struct.pack("<Q", len(blob)) + blob)
        self.data_bytes = offset
        self.position = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        want = self.expected[self.position]
        got = (name, tensor.dtype, tuple(tensor.shape))
        if got != want:
            raise AssertionError(f"safetensors writer: expected {want}, got {got}")
        self.file.write(memoryview(tensor.detach().contiguous().view(torch.uint8).numpy()))
        self.position += 1

    def close(self) -> str:
        """Finish the file; return its sha256."""
        if self.position != len(self.expected):
            raise AssertionError(f"safetensors writer: {len(self.expected) - self.position} tensors never written")
        self.file.close()
        return self.sha.result()

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()
        self.sha.stop()
