"""The files a checkpoint brings are read only if they are regular files of a size their kind can have.

A config.json linked to /dev/zero would be read until memory runs out, a FIFO would block the read
for ever: both are refused before the file is opened, naming the file and the reason. A side file
(config, tokenizer, chat template: ``SIDE_FILES``) that is a link must resolve inside the folder that
holds it (in the Hub cache: inside that repository's folder, whose blobs its snapshots link to): an
export copies and embeds side files, and a link to a user's secrets would be published with it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import where

MiB = 1 << 20
# The largest file of each kind a real checkpoint has, with room: Gemma 3's tokenizer.json is 33 MB,
# Llama 3's 9 MB; config files are kilobytes (a tokenizer_config.json with a big chat template ~1 MB).
LIMITS = {
    "tokenizer.json": 512 * MiB,
    "vocab.json": 256 * MiB,
    "merges.txt": 256 * MiB,
    "tokenizer.model": 128 * MiB,
    "chat_template.jinja": 16 * MiB,
}
JSON_LIMIT = 64 * MiB  # config.json, tokenizer_config.json, an index, …
UNLIMITED = None  # weights (safetensors, GGUF, .bin): mapped, never read whole
SIDE_FILES = frozenset({"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                        "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
                        "processor_config.json", "model.safetensors.index.json"})


def regular_file(path: Path, limit: int | None | str = "by name") -> Path:
    """``path`` if it is (or links to) a regular file of at most ``limit`` bytes ("by name": the limit
    of its kind, see LIMITS, else JSON_LIMIT); a GptconvError naming it otherwise."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise where(path, "no such file" + (" (a link to nothing)" if os.path.islink(path) else "")) from None
    except OSError as e:
        raise where(path, e.strerror or str(e)) from None
    if not stat.S_ISREG(st.st_mode):
        raise where(path, f"is {_kind(st.st_mode)}, not a regular file; refusing to read it")
    if path.name in SIDE_FILES and os.path.islink(path):
        _contained(path)
    if limit == "by name":
        limit = LIMITS.get(path.name, JSON_LIMIT)
    if limit is not None and st.st_size > limit:
        raise where(path, f"is {st.st_size:,} bytes, more than a {path.name} can be ({limit:,}); refusing to read it")
    return path


def _contained(path: Path) -> None:
    """A linked side file's target must lie inside the folder that holds the link, or, in the Hub cache
    (``models--ORG--NAME/snapshots/REV/FILE``), inside that repository's folder."""
    folder = path.parent.resolve()
    root = folder.parent.parent if folder.parent.name == "snapshots" and \
        folder.parent.parent.name.startswith(("models--", "datasets--")) else folder
    target = path.resolve()
    if not target.is_relative_to(root):
        raise where(path, f"links to {target}, outside {root}; a side file must be inside its checkpoint's folder "
                          "(copy it in if it is meant to be there)")


def read_text(path: Path, limit: int | None | str = "by name") -> str:
    """A checked file's text (UTF-8)."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise where(path, f"not UTF-8 text ({e})") from None


def read_bytes(path: Path, limit: int | None | str = "by name") -> bytes:
    path = regular_file(path, limit)
    try:
        with open(path, "rb") as f:
            return f.read() if limit is None else f.read(os.stat(path).st_size + 1)
    except OSError as e:
        raise where(path, e.strerror or str(e)) from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"
