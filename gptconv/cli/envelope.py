"""The one shape of every command's ``--json``: what ran (gptconv, torch and the references' versions),
on what (the resolved source: repo, revision, commit, each file's size and sha256), how long it took,
and the result (the library function's ``to_dict()``)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

from ..loader import resolve
from ..results import Result

PACKAGES = ("torch", "transformers", "llama-cpp-python", "gguf", "safetensors", "tokenizers", "huggingface-hub")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def versions() -> dict[str, str | None]:
    from .. import __version__
    out: dict[str, str | None] = {"gptconv": __version__}
    for package in PACKAGES:
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = None
    return out


def described(source: str | Path, revision: str | None = None) -> dict[str, Any]:
    """Where SOURCE resolved to (from the cache the command just used: no Hub request) and its files."""
    from ..sources.hub import files_to_fetch
    path, repo = resolve(source, revision, prefer_cache=True)
    in_cache = repo is not None and path.parent.name == "snapshots"
    if path.is_dir():  # the files a load reads (what a pull fetches), not everything beside them
        used = set(files_to_fetch([p.name for p in path.iterdir() if p.is_file()]))
        files = sorted(p for p in path.iterdir() if p.name in used)
    else:
        files = [path]
    return {"name": str(source), "repo": repo, "revision": revision, "commit": path.name if in_cache else None,
            "path": str(path), "files": [_file(p) for p in files]}


def _file(path: Path) -> dict[str, Any]:
    """Size and sha256; the Hub cache names a weight file's blob by its sha256 (checked when it was
    downloaded), which is not read again. Anywhere else a name proves nothing: the file is read."""
    real = path.resolve()
    in_cache = real.parent.name == "blobs" and real.parent.parent.name.startswith("models--")
    return {"name": path.name, "bytes": path.stat().st_size,
            "sha256": real.name if in_cache and _SHA256.fullmatch(real.name) else _sha256(path)}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def envelope(command: str, result: Result | dict, seconds: float, source: str | Path | None = None,
             revision: str | None = None) -> str:
    """The --json text of a command."""
    body = {"command": command, "versions": versions(),
            "source": described(source, revision) if source is not None else None,
            "seconds": round(seconds, 3),
            "result": result if isinstance(result, dict) else result.to_dict()}
    return json.dumps(body, indent=2, default=str, allow_nan=False)
