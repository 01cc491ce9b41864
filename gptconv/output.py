"""Writing outputs (export, ``reference -o``): atomic, hashed while written, written behind.

An output appears complete or not at all, and replaces only what the user agreed to replace
(``atomic_output``); its sha256 is taken as it grows (``TailHash``); writes run on one other thread
while the next tensor is converted (``WriteBehind``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import signal
import time
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .errors import where


class Terminated(BaseException):
    """SIGTERM while an output was being written (raised in the main thread, so its cleanup runs)."""


_signalled: list[int | None] = [None]  # the signal (SIGINT, SIGTERM) that stopped this process, once one did


def signalled() -> int | None:
    """The signal received, if one was: an interrupted read may surface as another exception (safetensors
    turns the KeyboardInterrupt raised inside its read into a ValueError), which is still the signal."""
    return _signalled[0]


def note_interrupts() -> None:
    """SIGINT raises KeyboardInterrupt, as by default, and is remembered (``signalled``)."""
    def handler(signum, frame):
        _signalled[0] = signum
        signal.default_int_handler(signum, frame)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)


def check_output(out: Path, force: bool, kind: str = "file", keep: tuple[Path, ...] = (),
                 writes: Callable[[str], bool] | None = None) -> Path:
    """``out`` as an absolute path if an output of ``kind`` ("file" or "folder") may be written there:
    a real name in an existing folder, and nothing there (a dangling link counts) unless ``force``;
    with ``force``, only a regular file (or a link to one, or to nothing: the link is replaced) for a
    file, only a folder for a folder, that is not, and does not hold, the working folder or one of
    ``keep`` (the source), and a folder only if it holds nothing but the names ``writes`` accepts (what
    the folder's writer puts there)."""
    out = Path(out)
    if out.name in ("", ".", ".."):
        raise where(out, "is not a name an output can be written under")
    out = Path(os.path.abspath(out))
    if not out.parent.is_dir():
        raise where(out.parent, "no such folder")
    _check_name_length(out)
    if _identity(out) is None:
        return out
    if not force:
        raise where(out, "already exists; pass --force to replace it")
    there = describe(out)  # a device, a FIFO or a socket is never replaced: as root, /dev/null was
    if there not in REPLACEABLE[kind]:
        raise where(out, f"is {there}; --force replaces only {REPLACES[kind]}, so it is left as it is")
    real = out.resolve()
    for what, inside in (("the working folder", Path.cwd()), *(("a file of the source", k) for k in keep)):
        inside = Path(os.path.abspath(inside)).resolve()
        if inside == real or real in inside.parents:
            raise where(out, f"{'is' if inside == real else 'holds'} {what} ({inside}); --force will not replace it")
    if kind == "folder":
        if writes is None:
            raise TypeError("check_output: a folder output needs writes, the names its writer puts there")
        _check_export_folder(out, writes)
    return out


# the longest name a temporary beside the output takes: "." + NAME + ".partial-" + a pid + ".bf16"
TEMPORARY_EXTRA = len(".") + len(".partial-") + 7 + len(".bf16")


def _check_name_length(out: Path) -> None:
    """An output name whose temporary the file system could not hold is refused before any work."""
    try:
        limit = os.pathconf(out.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    size = len(os.fsencode(out.name))
    if size + TEMPORARY_EXTRA > limit:
        raise where(out, f"its name is {size} bytes: with its temporary's {TEMPORARY_EXTRA} more it passes this file "
                         f"system's {limit}; choose a name of at most {limit - TEMPORARY_EXTRA} bytes")


REPLACEABLE = {"file": ("a file", "a symbolic link to a file", "a symbolic link to nothing"), "folder": ("a folder",)}
REPLACES = {"file": "a regular file (or a link to one)", "folder": "a folder an export wrote"}
SPECIAL = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
           (stat.S_ISSOCK, "a socket"))


def describe(path: Path) -> str:
    """What is at ``path``, in words: "a file", "a folder", "a FIFO", "a symbolic link to a character
    device (/dev/null)", "a symbolic link loop", "a symbolic link to nothing", …"""
    mode = os.lstat(path).st_mode
    if not stat.S_ISLNK(mode):
        return _kind(mode)
    try:
        target = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop"
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return "a symbolic link to nothing"
        return f"a symbolic link whose target cannot be reached ({e.strerror})"
    kind = _kind(target.st_mode)
    return f"a symbolic link to {kind}" + ("" if kind in ("a file", "a folder") else f" ({os.path.realpath(path)})")


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISDIR(mode):
        return "a folder"
    return next((name for test, name in SPECIAL if test(mode)), "a special file")


def _check_export_folder(folder: Path, written_by_export: Callable[[str], bool]) -> None:
    """Refuse a folder that holds anything an export does not write (a fine-tune's output folder holds
    its optimizer state and notes beside config.json): replacing it would delete them. What would be
    lost is named: the first few, and how many."""
    with os.scandir(folder) as found:
        entries = sorted(found, key=lambda e: e.name)
    if not entries:
        return
    foreign = [e.name + "/" if e.is_dir(follow_symlinks=False) else e.name for e in entries
               if e.is_dir(follow_symlinks=False) or not written_by_export(e.name)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        noun = ("files and folders" if any(n.endswith("/") for n in foreign)
                else "file" if len(foreign) == 1 else "files")
        raise where(folder, f"holds {len(foreign)} {noun} no export writes ({shown}), which --force would delete; "
                            "left as it is")
    if not any(e.name == "config.json" for e in entries):
        raise where(folder, "holds no config.json, so it is no exported model; --force will not replace it")


@contextlib.contextmanager
def atomic_output(out: Path, force: bool, kind: str = "file", keep: tuple[Path, ...] = (),
                  writes: Callable[[str], bool] | None = None, seen: Seen = "now") -> Iterator[Path]:
    """Yield a hidden temporary path beside ``out`` to write the output into (see check_output).

    On success it takes ``out``'s place in one rename that refuses to replace anything it did not
    expect: an output that appeared at ``out`` meanwhile (another export) is left as it is, and with
    ``force`` only what was there at the start is replaced. ``seen``: what was at ``out`` when the
    command began (``identity``, taken at its first check; "now" for this call), so that an output
    written meanwhile by another command is never what ``--force`` replaces. On failure, SIGINT or
    SIGTERM the temporary output is removed.
    """
    out = check_output(out, force, kind, keep, writes)
    was = _identity(out)
    if seen != "now" and was != seen:
        raise where(out, "changed since this command began (another export?); left as it is")
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


Seen = tuple[int, int, int, bool] | None | str  # an identity, or "now"


def identity(path: Path) -> tuple[int, int, int, bool] | None:
    """What is at ``path`` now, to be given to ``atomic_output`` as what the command saw first."""
    return _identity(Path(os.path.abspath(path)))


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
        if not os.path.isdir(src) and _link(src, dst):  # FileExistsError if anything is there
            os.unlink(src)
            return
        if os.path.lexists(dst):  # no hard links here either: a check just before a plain rename
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
        if _link(dst, old):
            os.replace(src, dst)
        else:  # no hard links (SMB, some FUSE): the old file aside, then the new one in
            os.rename(dst, old)
            os.rename(src, dst)
        os.rename(old, src)


def _link(src: Path, dst: Path) -> bool:
    """A hard link; False where the file system has none (SMB, some FUSE), to take another way."""
    try:
        os.link(src, dst)
        return True
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK):
            return False
        raise


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """SIGTERM raises Terminated in the main thread (as SIGINT raises KeyboardInterrupt), so the
    temporary output is removed instead of left behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        _signalled[0] = signum
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# a killed export's temporary under another output name is removed once untouched this long (a running
# export writes its own all the time; another machine's, on a shared folder, has a pid that means nothing here)
STALE_SECONDS = 3600


def _remove_stale_partials(out: Path) -> None:
    """Temporary outputs left by exports that were killed (their process is gone) are removed: those of
    this output at once, those of other names in its folder once an hour old (a name never reused)."""
    now = time.time()
    for tmp in out.parent.glob(".*.partial-*"):
        pid = tmp.name.rsplit("-", 1)[1].split(".")[0]  # .old after a swap, .f32 / .bf16 / .f16 an intermediate
        if not pid.isdigit() or _alive(int(pid)):
            continue
        mine = tmp.name.startswith(f".{out.name}.partial-")
        try:
            old = now - tmp.lstat().st_mtime > STALE_SECONDS
        except OSError:
            continue
        if mine or old:
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


# ---------------------------------------------------------------------------------------------------
# Hashing and writing behind

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
