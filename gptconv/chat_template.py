"""A checkpoint's chat template, rendered as the untrusted code it is.

Jinja's immutable sandbox keeps a template from touching Python objects, but not from looping for
ever (nested ``range(100000)``) or allocating without end (``'x' * 2e9``, a string doubled in a
loop). So, where the system can fork, the template renders in a child process with a deadline
(``SECONDS``) and an address-space limit (``MEMORY`` beyond what the process already maps), and
its output is cut at ``MAX_CHARS``; the child is killed when the deadline passes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time

from .errors import GptconvError

SECONDS = 5.0              # a real template renders in milliseconds
MEMORY = 1 << 30           # bytes the rendering may allocate
MAX_CHARS = 16 << 20       # characters of output (a prompt must fit a context window anyway)


def render(template: str, **variables: object) -> str:
    """``template`` rendered with ``variables`` in Jinja's immutable sandbox, bounded in time,
    memory and output; a GptconvError says which bound it passed or how the template failed."""
    if not hasattr(os, "fork"):
        kind, text = _answer(template, variables)  # no fork (Windows): the sandbox alone
        if kind == "error":
            raise GptconvError(text)
        return text
    import jinja2.sandbox  # noqa: F401  (imported once here, not in every child)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: render, send the answer, leave without running the parent's cleanup
        status = 0
        try:
            os.close(read_end)
            _limit_memory()
            answer = _answer(template, variables)
            with os.fdopen(write_end, "wb") as out:
                out.write(json.dumps(answer).encode())
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    answered = False
    try:
        data = _read_until(read_end, time.monotonic() + SECONDS, pid)
        answered = True
    finally:
        os.close(read_end)
        if not answered:  # a deadline, Ctrl-C or SIGTERM in the parent: the child goes too, now
            _kill(pid)
        _reap(pid)
    if not data:
        raise GptconvError("the chat template could not be rendered (its process ended without an answer)")
    kind, text = json.loads(data)
    if kind == "error":
        raise GptconvError(text)
    return text


def _answer(template: str, variables: dict) -> tuple[str, str]:
    try:
        return "ok", _render(template, variables)
    except MemoryError:
        return "error", f"the chat template needs more than {MEMORY >> 20:,} MiB to render; refusing it"
    except RecursionError:
        return "error", "the chat template recurses without end; refusing it"
    except GptconvError as e:
        return "error", str(e)
    except Exception as e:  # the template's own error ({{ 1/0 }}, {{ "a" + 1 }}): untrusted code failing
        return "error", f"the chat template failed: {type(e).__name__}: {str(e)[:200]}"


def _render(template: str, variables: dict) -> str:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        parts, size = [], 0
        for part in env.from_string(template).generate(**variables):
            size += len(part)
            if size > MAX_CHARS:
                raise GptconvError(f"the chat template renders more than {MAX_CHARS:,} characters; refusing it")
            parts.append(part)
        return "".join(parts)
    except TemplateError as e:
        raise GptconvError(f"the chat template failed: {e}") from None


def _limit_memory() -> None:
    import resource
    try:
        with open("/proc/self/statm") as f:  # pages mapped now (weights included), then MEMORY more
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no /proc (macOS): the deadline and the output limit still hold
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + MEMORY
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _read_until(fd: int, deadline: float, pid: int) -> bytes:
    chunks, size = [], 0
    poller = select.poll()  # not select(): it fails on descriptors past 1023
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise GptconvError(f"the chat template did not finish rendering in {SECONDS:g} s; refusing it")
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > 12 * MAX_CHARS + 1024:  # JSON of MAX_CHARS characters: at most 12 bytes each (a \uXXXX pair)
            raise GptconvError("the chat template's answer is larger than its output can be; refusing it")
        chunks.append(chunk)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
