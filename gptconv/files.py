"""The files a checkpoint brings are read only if they are regular files of a size their kind can have.

A config.json linked to /dev/zero would be read until memory runs out, a FIFO would block the read
for ever: both are refused before the file is opened, naming the file and the reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import os
import shutil
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from .errors import where

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
    if limit == "by name":
        limit = LIMITS.get(path.name, JSON_LIMIT)
    if limit is not None and st.st_size > limit:
        raise where(path, f"is {st.st_size:,} bytes, more than a {path.name} can be ({limit:,}); refusing to read it")
    return path


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


# ---------------------------------------------------------------------------------------------------
# Writing: an output appears complete or not at all, and replaces only what the user agreed to replace.

class Terminated(BaseException):
    """SIGTERM while an output was being written (raised in the main thread, so its cleanup runs)."""


def check_output(out: Path, force: bool, kind: str = "file", keep: tuple[Path, ...] = ()) -> Path:
    """``out`` as an absolute path if an output of ``kind`` ("file" or "folder") may be written there:
    a real name in an existing folder, and nothing there (a dangling link counts) unless ``force``;
    with ``force``, only a thing of the same kind that is not, and does not hold, the working folder
    or one of ``keep`` (the source), and a folder only if it looks like an exported model."""
    out = Path(out)
    if out.name in ("", ".", ".."):
        raise where(out, "is not a name an output can be written under")
    out = Path(os.path.abspath(out))
    if not out.parent.is_dir():
        raise where(out.parent, "no such folder")
    if _identity(out) is None:
        return out
    if not force:
        raise where(out, "already exists; pass --force to replace it")
    is_dir = stat.S_ISDIR(os.lstat(out).st_mode)
    if is_dir != (kind == "folder"):
        raise where(out, f"is {'a folder' if is_dir else 'a file'} and this output is "
                         f"{'a folder' if kind == 'folder' else 'a file'}; --force will not replace it")
    real = out.resolve()
    for what, inside in (("the working folder", Path.cwd()), *(("the source", k) for k in keep)):
        inside = Path(os.path.abspath(inside)).resolve()
        if inside == real or real in inside.parents:
            raise where(out, f"{'is' if inside == real else 'holds'} {what} ({inside}); --force will not replace it")
    if is_dir:
        entries = list(out.iterdir())
        if entries and (not (out / "config.json").exists()
                        or any(p.is_dir() and not p.is_symlink() for p in entries)):
            raise where(out, "is a folder that does not look like an exported model (no config.json, or "
                             "folders inside); --force will not replace it")
    return out


@contextlib.contextmanager
def atomic_output(out: Path, force: bool, kind: str = "file", keep: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Yield a hidden temporary path beside ``out`` to write the output into (see check_output).

    On success it takes ``out``'s place in one rename that refuses to replace anything it did not
    expect: an output that appeared at ``out`` meanwhile (another export) is left as it is, and with
    ``force`` only what was there at the start is replaced. On failure, SIGINT or SIGTERM the
    temporary output is removed.
    """
    out = check_output(out, force, kind, keep)
    was = _identity(out)
    _remove_stale_partials(out)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    _remove(tmp)
    with _terminate_cleanly():
        try:
            yield tmp
            _move_into_place(tmp, out, was)
        except OSError as e:
            if e.filename is not None and Path(e.filename).parent == tmp.parent and e.strerror:
                raise where(out, f"cannot be written ({e.strerror})") from None  # not our temporary's name
            raise
        finally:
            _remove(tmp)  # ours after a failure; after a swap, what was at out before


def _identity(path: Path) -> tuple[int, int, int, bool] | None:
    """What is at ``path`` (the link itself, if it is one): device, inode, mtime, whether a folder."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, stat.S_ISDIR(st.st_mode)


def _move_into_place(tmp: Path, out: Path, was: tuple | None) -> None:
    if was is None:
        try:
            _rename(tmp, out, RENAME_NOREPLACE)
        except FileExistsError:
            raise where(out, "appeared while this export ran (another one?); left as it is, "
                             "pass --force to replace it") from None
        return
    try:  # swap the two, then look at what came out: if it is not what was there at the start, swap back
        _rename(tmp, out, RENAME_EXCHANGE)
    except FileNotFoundError:
        raise where(out, "was removed while this export ran; nothing written, run it again") from None
    if _identity(tmp) != was:
        _rename(tmp, out, RENAME_EXCHANGE)
        raise where(out, "changed while this export ran (another one?); left as it is")
    # what comes out of the swap is the old output, now at the temporary name: removed by the caller


RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
AT_FDCWD = -100


def _rename(src: Path, dst: Path, flag: int) -> None:
    """renameat2(2) with RENAME_NOREPLACE or RENAME_EXCHANGE (Linux ≥ 3.15, glibc ≥ 2.28); where the
    system or the file system lacks it, a hard link for a file, and a check just before a plain rename
    otherwise."""
    if _renameat2 is not None:
        if _renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flag) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(dst))
    if flag == RENAME_NOREPLACE:
        if not os.path.isdir(src):
            os.link(src, dst)  # FileExistsError if anything is there
            os.unlink(src)
            return
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "exists", str(dst))
        os.rename(src, dst)
        return
    if os.path.isdir(src):  # no exchange: the old folder aside, the new one in, the old one back as src
        aside = src.with_name(src.name + ".old")
        os.rename(dst, aside)
        os.rename(src, dst)
        os.rename(aside, src)
    else:
        old = src.with_name(src.name + ".old")
        os.link(dst, old)
        os.replace(src, dst)
        os.rename(old, src)


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """SIGTERM raises Terminated in the main thread (as SIGINT raises KeyboardInterrupt), so the
    temporary output is removed instead of left behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _remove_stale_partials(out: Path) -> None:
    """Temporary outputs left by exports that were killed (their process is gone) are removed."""
    for tmp in out.parent.glob(f".{glob.escape(out.name)}.partial-*"):
        pid = tmp.name.rsplit("-", 1)[1].removesuffix(".old")
        if pid.isdigit() and not _alive(int(pid)):
            _remove(tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
