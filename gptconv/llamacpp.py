"""llama.cpp through llama-cpp-python's C API: a GGUF file run by llama.cpp itself (``LlamaCpp``, which
verify's llama.cpp reference and perplexity use) and its quantizer (export's K-quants, dequantizing).

Settings are the ones under which llama.cpp's numbers are comparable with ours: an F32 KV cache,
weights in plain CPU buffers (on a CPU with AMX, llama.cpp's repacked buffers crash on Q8_0 and
K-quant weights: ggml-org/llama.cpp#20824), every position's logits, special tokens parsed in text.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import GptconvError, where

EXTRA = "pip install 'gptconv[llama-cpp]'"


def library(purpose: str = "llama.cpp as a reference") -> Any:
    """llama-cpp-python's C API, initialised once, its log kept for our error messages."""
    try:
        import llama_cpp
    except ImportError:
        raise GptconvError(f"{purpose} needs llama-cpp-python ({EXTRA})") from None
    global _log_callback
    if _log_callback is None:
        @llama_cpp.llama_log_callback
        def keep(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            line = text.decode("utf-8", "replace").strip()
            if line and (level == WARN or level == ERROR and ERROR not in _said):
                _said[level] = line
        _log_callback = keep
        llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
    return llama_cpp


# ggml's log levels (ggml.h: NONE, DEBUG, INFO, WARN, ERROR, CONT). Levels 2 and 3 were kept as
# "warnings and errors", which are INFO and WARN: llama.cpp's errors (4) were dropped, and a refused
# file was reported as "(no message)", or with the last INFO line of the load as its reason.
WARN, ERROR = 3, 4
_said: dict[int, str] = {}  # since the call began (_listen): llama.cpp's first error and its last warning
_log_callback = None


def version() -> str:
    import importlib.metadata
    return importlib.metadata.version("llama-cpp-python")


def _listen() -> None:
    """Forget what llama.cpp said before the call about to be made."""
    _said.clear()


def _failed(path: Path, what: str) -> GptconvError:
    """llama.cpp ``what`` ("cannot load this file"), with its reason: its first error since _listen()
    (the ones after it only say that the load failed; the function name it starts with dropped), else
    its last warning; where it gave none, a pointer to what the file holds."""
    said = _said.get(ERROR) or _said.get(WARN)
    if said:
        return where(path, f"llama.cpp {what} ({re.sub(r'^[A-Za-z_][A-Za-z0-9_]*: ', '', said)})")
    return where(path, f"llama.cpp {what} and gave no reason; `gptconv inspect {shlex.quote(str(path))}` "
                       f"lists the file's metadata and tensors")


class LlamaCpp:
    """One GGUF file loaded in llama.cpp; ``vocab_only`` loads only its tokenizer."""

    def __init__(self, path: Path, n_ctx: int = 512, vocab_only: bool = False, n_seq: int = 1) -> None:
        self.lib = lib = library()
        self.path = Path(path)
        params = lib.llama_model_default_params()
        params.use_extra_bufts = False
        # the file mapped, its pages the page cache's: llama.cpp's default (auto) reads a large file into memory
        # of its own instead (a 32 GB F32 file: 24 GB of anonymous memory, then the OOM killer)
        params.load_mode = lib.LLAMA_LOAD_MODE_MMAP
        params.vocab_only = vocab_only
        _listen()
        self.model = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.model:
            raise _failed(self.path, "cannot load this file")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self.ctx = None
        if not vocab_only:
            c = lib.llama_context_default_params()
            c.n_ctx = c.n_batch = c.n_ubatch = n_ctx
            c.n_seq_max = n_seq
            c.kv_unified = n_seq > 1  # the sequences of one batch share the context's cells
            c.n_threads = c.n_threads_batch = torch.get_num_threads()
            c.type_k = c.type_v = 0  # GGML_TYPE_F32
            c.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
            c.no_perf = True
            _listen()
            self.ctx = lib.llama_init_from_model(self.model, c)
            if not self.ctx:
                self.close()
                raise _failed(self.path, "cannot make a context for this file")
            self.n_ctx = n_ctx

    @property
    def bos_replacing_first(self) -> int | None:
        """The BOS id when this vocabulary adds one (llama-perplexity puts it first in each window)."""
        return self.lib.llama_vocab_bos(self.vocab) if self.lib.llama_vocab_get_add_bos(self.vocab) else None

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids as llama.cpp makes them, special tokens written in ``text`` parsed."""
        data = text.encode("utf-8")
        room = len(data) + 8
        out = (self.lib.llama_token * room)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), out, room, add_special, True)
        if n < 0:
            raise where(self.path, f"llama.cpp failed to tokenize {text[:40]!r}")
        return list(out[:n])

    def logits(self, ids: list[int]) -> np.ndarray:
        """float32 logits (T, V) at every position of one sequence, from an empty cache."""
        lib = self.lib
        if not 0 < len(ids) <= self.n_ctx:
            raise ValueError(f"{len(ids)} ids for a context of {self.n_ctx}")
        lib.llama_memory_clear(lib.llama_get_memory(self.ctx), True)
        batch = lib.llama_batch_init(len(ids), 0, 1)
        try:
            for i, token in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            batch.n_tokens = len(ids)
            _listen()
            if lib.llama_decode(self.ctx, batch) != 0:
                raise _failed(self.path, f"failed to evaluate {len(ids)} tokens")
            pointer = lib.llama_get_logits(self.ctx)
            return np.ctypeslib.as_array(pointer, shape=(len(ids), self.n_vocab)).copy()
        finally:
            lib.llama_batch_free(batch)

    def logits_of_each(self, sequences: list[list[int]]) -> list[np.ndarray]:
        """float32 logits (T, V) at every position of each sequence, all evaluated in one batch (each its
        own sequence, from an empty cache): llama.cpp reads its weights once for all of them."""
        lib = self.lib
        total = sum(len(ids) for ids in sequences)
        if not 0 < total <= self.n_ctx or any(not ids for ids in sequences):
            raise ValueError(f"{total} ids for a context of {self.n_ctx}")
        lib.llama_memory_clear(lib.llama_get_memory(self.ctx), True)
        batch = lib.llama_batch_init(total, 0, 1)
        try:
            n = 0
            for seq, ids in enumerate(sequences):
                for i, token in enumerate(ids):
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, i, 1
                    batch.seq_id[n][0] = seq
                    batch.logits[n] = True
                    n += 1
            batch.n_tokens = total
            _listen()
            if lib.llama_decode(self.ctx, batch) != 0:
                raise _failed(self.path, f"failed to evaluate {total} tokens in {len(sequences)} sequences")
            pointer = lib.llama_get_logits(self.ctx)
            every = np.ctypeslib.as_array(pointer, shape=(total, self.n_vocab))
            out, start = [], 0
            for ids in sequences:
                out.append(every[start:start + len(ids)].copy())
                start += len(ids)
            return out
        finally:
            lib.llama_batch_free(batch)

    def close(self) -> None:
        if self.ctx:
            self.lib.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> LlamaCpp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def quantize_file(path: Path, out: Path, ftype: str) -> None:
    """llama.cpp's own quantizer (the code behind ``llama-quantize``) on a GGUF file: ``ftype`` one of
    its mixes (``Q4_K_M``, ``Q6_K``, ``Q4_0`` …), which chooses each tensor's type by llama.cpp's rules."""
    library(f"exporting {ftype.lower()} (llama.cpp's quantizer)")
    run_quantizer(path, out, f"MOSTLY_{ftype}", f"llama.cpp's quantizer cannot make {ftype} of this file")


def dequantize_file(path: Path, out: Path) -> None:
    """llama.cpp's own quantizer (the code behind ``llama-quantize``) writing ``path`` with every
    weight in F32: the file's weights as llama.cpp itself dequantizes them."""
    library()
    run_quantizer(path, out, "ALL_F32", "llama.cpp's quantizer cannot rewrite this file in F32")


STOPS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _deferred_stops() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM noted, not acted on, inside the context (the main thread's handlers run
    whichever thread the kernel gives a signal to); the list of those that came."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    saved = {s: signal.signal(s, lambda signum, _frame: came.append(signum)) for s in STOPS}
    try:
        yield came
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def run_quantizer(path: Path, out: Path, ftype: str, failure: str) -> None:
    """``quantizer_child.py`` in a child process, waited for in this one, where Ctrl-C and SIGTERM
    still act at once: the child is killed and the caller's cleanup runs (a quantizer called here, in
    C, would hold them off until it returned)."""
    child = Path(__file__).with_name("quantizer_child.py")
    # Ctrl-C / SIGTERM deferred until the child is known: one acting while Popen still waits for the
    # child's exec would leave it running, orphaned (seen on a loaded machine)
    # (the try encloses the deferral: a stop landing as the handlers come back, before a try after it, would
    # skip the kill and leave the child to outlive us; once, under load, the suite found it alive after a Ctrl-C)
    proc = None
    try:
        with _deferred_stops() as came:
            proc = subprocess.Popen([sys.executable, str(child), str(path), str(out), ftype,
                                     str(torch.get_num_threads())], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
        for signum in came:  # now, with the child known, as its own handler would have
            signal.raise_signal(signum)
        _, err = proc.communicate()
    finally:
        if proc is not None and proc.poll() is None:  # interrupted: stop it now, before the caller removes its files
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        lines = [line.strip() for line in err.splitlines() if line.strip()]
        raise where(path, f"{failure} ({lines[-1] if lines else f'the quantizer exited {proc.returncode}'})")
