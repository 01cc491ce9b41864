"""Hostile files for test_hostile_round2.py: a GGUF file with array metadata, a lying array count,
a pytorch_model.bin with a short data record, and a CLI run bounded in memory and time."""

from __future__ import annotations

import resource
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from unittest import mock

from gguf import GGUFReader, GGUFWriter

import test_gguf_errors

MEMORY = 6 << 30  # address space a CLI run may map: torch imports in well under it, a runaway read does not fit
TIMEOUT = 120


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def bounded_cli(*args, env: dict | None = None, cwd: Path | None = None, timeout: float = TIMEOUT
                ) -> subprocess.CompletedProcess:
    """``python -m gptconv ARGS`` under an address-space limit and a timeout (arguments may be bytes,
    for file names that are not UTF-8)."""
    argv = [sys.executable, "-m", "gptconv", *(a if isinstance(a, bytes) else str(a) for a in args)]
    return subprocess.run(argv, capture_output=True, text=True, errors="backslashreplace", env=env, cwd=cwd,
                          timeout=timeout, preexec_fn=_limit_memory)


def bounded_popen(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gptconv", *map(str, args)], preexec_fn=_limit_memory, **kwargs)


class _WithVocab(GGUFWriter):
    """A GGUFWriter that adds a small SentencePiece-style vocabulary (three array-typed entries)."""

    def write_header_to_file(self, *args, **kwargs) -> None:
        self.add_tokenizer_model("llama")
        self.add_token_list([f"tok{i}" for i in range(100)])
        self.add_token_scores([float(-i) for i in range(100)])
        self.add_token_types([1] * 100)
        super().write_header_to_file(*args, **kwargs)


def write_gguf_with_vocab(path: Path) -> Path:
    """test_gguf_errors.write_llama_gguf's model, plus tokenizer.ggml.tokens / scores / token_type arrays."""
    with mock.patch.object(test_gguf_errors, "GGUFWriter", _WithVocab):
        return test_gguf_errors.write_llama_gguf(path)


def array_count_position(path: Path, key: str) -> int:
    """Byte position of the u64 item count of the array-typed metadata entry ``key``: its parts are
    the key's length, the key, the value type, the item type, the count, then the items."""
    field = GGUFReader(path).fields[key]
    return field.offset + sum(p.nbytes for p in field.parts[:4])


def patch_u64(path: Path, pos: int, value: int) -> int:
    data = bytearray(path.read_bytes())
    old = struct.unpack_from("<Q", data, pos)[0]
    struct.pack_into("<Q", data, pos, value)
    path.write_bytes(bytes(data))
    return old


def shorten_zip_record(src: Path, dst: Path, record: str, keep: int) -> None:
    """A copy of torch.save's zip archive ``src`` in which the entry ending in ``record`` (``/data/0``)
    holds only ``keep`` bytes (every entry ZIP_STORED, each data record 64-byte aligned as torch writes it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(record):
                assert keep < len(data), (keep, len(data))
                data = data[:keep]
            out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            start = zout.fp.tell() + 30 + len(info.filename.encode()) + 4  # past the local header and the pad's own header
            pad = -start % 64
            out.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # torch's own padding record ("FB")
            zout.writestr(out, data)
