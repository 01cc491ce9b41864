"""Reading a local Hugging Face checkpoint folder: config.json plus weights.

Weights: ``model.safetensors``, or shards listed by ``model.safetensors.index.json``; only when
no safetensors exist, ``pytorch_model.bin`` (or its sharded form), read with
``torch.load(weights_only=True)`` so a pickle can never run code. Tensors are listed (names,
shapes, dtypes) without reading them, and each is read from a memory map when asked for.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..errors import first_line, where
from .files import UNLIMITED, read_text, regular_file
from ..convert.keymap import TensorInfo
from .quantized import dequantized

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,  # FP8 weights (``sources/quantized.py`` reads them with their scales)
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass
class HFCheckpoint:
    folder: Path
    config: dict[str, Any]
    weight_files: list[Path]
    tensors: dict[str, TensorInfo]

    @property
    def model_type(self) -> str:
        return self.config["model_type"]


def read_json(path: Path) -> Any:
    """A JSON side file, read only if it is a regular file of a size its kind can have (``files.py``)."""
    text = read_text(path)
    try:
        return json.loads(text)
    except RecursionError:
        raise where(path, "not valid JSON (nested deeper than any config; refusing to parse it)") from None
    except json.JSONDecodeError as e:
        raise where(path, f"not valid JSON ({e})") from None
    except ValueError as e:  # an integer of thousands of digits: Python's conversion limit
        raise where(path, f"not valid JSON ({first_line(e)})") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """An optional JSON side file (tokenizer_config.json, …): {} when absent, an error when not an object."""
    if not path.exists():
        return {}
    data = read_json(path)
    if not isinstance(data, dict):
        raise where(path, "not a JSON object")
    return data


def token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or {"content": …}."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def read_hf_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    data = read_json(path)
    if not isinstance(data, dict):
        raise where(path, "not a JSON object")
    if not isinstance(data.get("model_type"), str):
        raise where(path, "no 'model_type' string: cannot tell the architecture")
    return data


def open_hf_folder(folder: Path, backend: str = "mmap") -> HFCheckpoint:
    """``backend``: how tensors are served. "mmap": zero-copy from one mapping of each file, kept
    while the checkpoint is open (for a model that keeps its weights). "per-tensor": zero-copy too, but
    each tensor maps its file anew and unmaps it when the tensor is freed, so a pass over a large
    checkpoint (export, blockwise verify) holds only the tensors in use, not every page it read."""
    if backend not in ("mmap", "per-tensor"):
        raise ValueError(f"backend {backend!r}: 'mmap' or 'per-tensor'")
    folder = Path(folder)
    if not folder.is_dir():
        raise where(folder, "not a folder")
    config = read_hf_config(folder)
    files, index = weight_files(folder)
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        infos = read_safetensors(file, backend) if file.suffix == ".safetensors" else read_torch_bin(file)
        for name, info in infos.items():
            if name in tensors:
                raise where(folder, f"tensor '{name}' is stored in more than one file")
            tensors[name] = info
    if index is not None:
        check_index(index, tensors)
    return HFCheckpoint(folder, config, files, dequantized(tensors, config, folder / "config.json"))


def weight_files(folder: Path) -> tuple[list[Path], Path | None]:
    """The weight files to read (safetensors first) and the shard index if there is one."""
    for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        index = folder / index_name
        if index.exists():
            names = sorted(set(index_weight_map(index).values()))
            return [shard_path(folder, index, name) for name in names], index
        if (folder / single).exists():
            return [folder / single], None
    raise where(folder, "no weights: expected model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def index_weight_map(index: Path) -> dict[str, str]:
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise where(index, "no 'weight_map' object of tensor name → shard file")
    return weight_map


def shard_path(folder: Path, index: Path, name: str) -> Path:
    # A hostile index could name '../../etc/passwd' or '/etc/passwd': shards live beside the index.
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or p.name != name:
        raise where(index, f"shard '{name}' is not a plain file name in the checkpoint folder")
    path = folder / name
    if not path.is_file():
        raise where(index, f"shard '{name}' is missing")
    return path


def check_index(index: Path, tensors: dict[str, TensorInfo]) -> None:
    """A sharded checkpoint's index and its shards must agree tensor for tensor."""
    weight_map = index_weight_map(index)
    missing = sorted(set(weight_map) - set(tensors))
    unlisted = sorted(set(tensors) - set(weight_map))
    if missing:
        raise where(index, f"lists tensor '{missing[0]}' which is in no shard" + _more(missing))
    if unlisted:
        raise where(index, f"does not list tensor '{unlisted[0]}' found in a shard" + _more(unlisted))


def _more(items: list) -> str:
    return f" (+{len(items) - 1} more)" if len(items) > 1 else ""


def read_safetensors(path: Path, backend: str = "mmap") -> dict[str, TensorInfo]:
    regular_file(path, UNLIMITED)
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
        infos = {}
        for name in handle.keys():
            sl = handle.get_slice(name)
            dtype = SAFETENSORS_DTYPES.get(sl.get_dtype())
            if dtype is None:
                raise where(path, f"tensor '{name}' has dtype {sl.get_dtype()}, which gptconv does not read")
            infos[name] = TensorInfo(tuple(sl.get_shape()), dtype, _safetensors_loader(handle if backend == "mmap" else None,
                                                                                   path, name))
        return infos
    except (SafetensorError, OSError) as e:
        raise where(path, f"not a readable safetensors file ({first_line(e)})") from None


def _safetensors_loader(handle: Any, path: Path, name: str):
    """Reads ``name`` from the open ``handle``, or, with none, from a mapping of its own (a tensor
    keeps the mapping it came from alive, and it goes with the tensor)."""
    def load() -> torch.Tensor:
        try:
            if handle is not None:
                return handle.get_tensor(name)
            with safe_open(str(path), framework="pt", device="cpu") as own:
                return own.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise where(path, f"tensor '{name}' cannot be read ({first_line(e)})") from None
    return load


def read_torch_bin(path: Path) -> dict[str, TensorInfo]:
    regular_file(path, UNLIMITED)
    zipped = zipfile.is_zipfile(path)
    if not zipped and not _starts_like_a_pickle(path):
        raise where(path, "not a PyTorch checkpoint (neither torch.save's zip archive nor its older pickle format)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols it reads anyway
            # the zip format is memory-mapped; the older pickle format cannot be
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as e:
        # torch's message for every pickle it will not read ends in advice to pass weights_only=False: never
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if found is not None:
            raise where(path, f"refused: the pickle would call code ({found.group(1)}), not just build tensors; "
                              "gptconv loads .bin files only with torch.load(weights_only=True)") from None
        if "WeightsUnpickler error" in str(e):
            raise where(path, f"refused: torch.load(weights_only=True) cannot read this pickle "
                              f"({_pickle_problem(e)}); gptconv loads .bin files only that way") from None
        raise where(path, f"not a readable PyTorch checkpoint (its pickle is corrupt: {_pickle_problem(e)})") from None
    except MemoryError:
        raise
    except Exception as e:  # torch.load's own checks raise RuntimeError, TypeError, AssertionError, …
        raise where(path, f"not a readable PyTorch checkpoint ({type(e).__name__}: {first_line(e)})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise where(path, "not a state dict of name → tensor")
    if zipped:
        _check_records(path, state)
    return {k: TensorInfo(tuple(v.shape), v.dtype, lambda v=v: v) for k, v in state.items()}


def _starts_like_a_pickle(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(2)
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5  # PROTO opcode, protocols 2 … 5


def _pickle_problem(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    advice = ("weights_only", "Weights only load failed", "WeightsUnpickler error", "Please file an issue")
    for line in lines:  # torch wraps the cause in advice; keep the cause
        if not any(a in line for a in advice):
            return line[:200]
    return type(e).__name__


def _check_records(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Every tensor's storage lies inside its own zip record. Memory-mapped loading takes a storage's
    size from the pickle and its bytes from wherever its record starts, so a record shorter than its
    storage would read the records after it (a plain torch.load refuses such a file)."""
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        records = {}  # where a record's data starts in the file → its size
        for info in z.infolist():
            if "/data/" in info.filename and info.compress_type == zipfile.ZIP_STORED:
                f.seek(info.header_offset)
                local = f.read(30)  # the local header: the name and extra field lengths at bytes 26 and 28
                start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
                records[start] = info.file_size
    storages = {}
    for name, t in state.items():
        s = t.untyped_storage()
        if s.nbytes():
            storages.setdefault(s.data_ptr(), (name, s.nbytes()))
    if not storages:
        return
    first = min(storages)
    base = _mapping_base(path, first)
    if base is None:  # no /proc: the base that puts every storage at a record's start (slower)
        base = next((first - start for start in records
                     if all(ptr - (first - start) in records for ptr in storages)), None)
    for ptr, (name, nbytes) in sorted(storages.items()):
        size = records.get(ptr - base) if base is not None else None
        if size is None:
            raise where(path, f"tensor '{name}' does not start at a data record of the archive")
        if nbytes > size:
            raise where(path, f"tensor '{name}' needs {nbytes:,} bytes but its record holds {size:,} "
                              "(a truncated or altered archive)")


def _mapping_base(path: Path, ptr: int) -> int | None:
    """Where byte 0 of ``path`` is in memory, from the mapping (``/proc/self/maps``) that holds ``ptr``."""
    try:
        inode = os.stat(path).st_ino
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and int(fields[4]) == inode:
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    if low <= ptr < high:
                        return low - int(fields[2], 16)
    except (OSError, ValueError):
        pass
    return None
