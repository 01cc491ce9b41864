"""Surgery on valid files, for the hostile-input and fuzz tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def read_safetensors_header(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_safetensors(header: dict, body: bytes) -> bytes:
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + body


def gguf_tensor_info_positions(path: Path, index: int) -> tuple[int, int]:
    """Byte positions of tensor ``index``'s type (u32) and data offset (u64) in its tensor-info entry."""
    from gguf import GGUFReader
    field = GGUFReader(path).tensors[index].field
    pos = field.offset
    starts = []
    for part in field.parts:
        starts.append(pos)
        pos += part.nbytes
    return starts[-2], starts[-1]
