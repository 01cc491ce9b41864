"""Running a model whose weights are read as it needs them, and several forward passes in lockstep.

A model too large to hold (or to hold beside a reference) is built on the meta device and filled
as it runs:

- each **block** (a transformer layer) gets its parameters just before it runs (a forward pre-hook)
  and gives them back afterwards (``Streamed.empty``), so one block is in memory at a time;
- each **table** (the token embedding, the LM head, per-layer embeddings: vocabulary × width) is
  never whole in memory: ``Rows`` is a weight that reads only the rows a lookup asks for, and
  computes a product with the head a slice of the vocabulary at a time (``SLICE_BYTES`` of rows);
- everything else (the final norm, biases outside the blocks) is read at the start and kept.

``Lane`` runs one forward pass in a thread of its own and stops at each named step, so that a caller
can take several passes (one per input, one per model) through the same block before the next one:
each block's weights are then read once per model, whatever the number of inputs, and each step's
outputs can be compared as soon as they exist, then dropped. Works on any ``nn.Module``: ours and
transformers' alike.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

RowReader = Callable[[slice | torch.Tensor], torch.Tensor]  # rows of a (V, d) table (a slice or sorted ids) → tensor

# A head product reads this many bytes of rows at a time (in the model's dtype). The slicing is fixed
# by the table's width and dtype alone, so a streamed model and a whole one given the same table as
# ``Rows`` compute the same bits (float64 matrix products round differently when cut differently).
SLICE_BYTES = 64 << 20


class Rows(torch.Tensor):
    """A (V, d) weight read by rows as it is used, never held whole: a lookup (``F.embedding``) reads
    the rows of the ids it is given; a product (``F.linear``, ``torch.mv``: the LM head) reads
    ``SLICE_BYTES`` of rows at a time and writes that slice of the vocabulary's outputs. Its values
    are ``read(rows)`` in ``dtype``. Any other use of it is an error naming the operation (its
    shape, dtype and other properties read as a tensor's)."""

    read: RowReader

    @staticmethod
    def __new__(cls, shape: tuple[int, int], dtype: torch.dtype, read: RowReader) -> Rows:
        t = torch.Tensor._make_subclass(cls, torch.empty(shape, dtype=dtype, device="meta"), False)
        t.read = read
        return t

    def slices(self, inputs: int = 1) -> Iterable[slice]:
        """The row ranges a product with ``inputs`` rows of input reads, in order: each slice of the
        weight, and of the output, at most ``SLICE_BYTES``."""
        n, d = self.shape
        step = max(1, SLICE_BYTES // (max(d, inputs) * self.dtype.itemsize))
        return (slice(a, min(a + step, n)) for a in range(0, n, step))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.embedding:
            return _lookup(*args, **kwargs)
        if func is F.linear:
            return _product(*args, **kwargs)
        if func in (torch.mv, torch.Tensor.mv):
            weight, vector = args
            return _product(vector, weight)
        if func in (torch.addmv, torch.Tensor.addmv) and not kwargs:
            bias, weight, vector = args
            return _product(vector, weight, bias)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)  # on the meta tensor: shape, dtype, device, strides …
        if isinstance(out, torch.Tensor) and func not in _META_VIEWS:
            raise RuntimeError(f"{func.__name__ if hasattr(func, '__name__') else func} of a weight read by rows "
                               "(a streamed table supports lookups and products only)")
        return out

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"Rows(shape={tuple(self.shape)}, dtype={self.dtype})"


# what a state dict or a loader asks of a parameter: a meta tensor of its shape, no values
_META_VIEWS = {torch.Tensor.detach, torch.Tensor.requires_grad_}


def _lookup(ids: torch.Tensor, weight: Rows, padding_idx=None, max_norm=None, norm_type=2.0,
            scale_grad_by_freq=False, sparse=False) -> torch.Tensor:
    """F.embedding of ``ids`` in a table read by rows: only the rows of the ids present (``padding_idx``
    only changes gradients, and none flow here)."""
    if max_norm is not None:
        raise RuntimeError("an embedding with max_norm rewrites its table; it cannot be read by rows")
    present, where = torch.unique(ids, return_inverse=True)  # sorted
    rows = weight.read(present.cpu())
    return F.embedding(where.to(rows.device), rows)


def _product(x: torch.Tensor, weight: Rows, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weightᵀ (+ bias) with ``weight`` read a slice of rows at a time (each slice of the weight and
    of the outputs within ``SLICE_BYTES``), each slice's outputs copied into their columns."""
    out = None
    for part in weight.slices(x.shape[:-1].numel()):
        w = weight.read(part).to(x.device)
        y = F.linear(x, w, None if bias is None else bias[part])
        if out is None:
            out = torch.empty(*y.shape[:-1], weight.shape[0], dtype=y.dtype, device=y.device)
        out[..., part] = y
        del w, y
    return out


def assign(root: nn.Module, names: list[str], tensor: torch.Tensor) -> None:
    """Set every name in ``names`` (one parameter under several names: a tied head) to ``tensor``."""
    p = tensor if isinstance(tensor, Rows) else nn.Parameter(tensor, requires_grad=False)
    for name in names:
        owner, _, leaf = name.rpartition(".")
        root.get_submodule(owner)._parameters[leaf] = p


def tie_groups(model: nn.Module) -> dict[str, list[str]]:
    """Each parameter's first name → every name it has (a tied head: the embedding's and the head's)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return {names[0]: names for names in groups.values()}


def model_device(model: nn.Module) -> torch.device:
    """Where a model runs: the device of its first parameter in memory (a streamed one holds meta tensors)."""
    return next((p.device for p in model.parameters() if not p.is_meta), torch.device("cpu"))


def table_names(model: nn.Module, head: str | None) -> list[str]:
    """The tables of ``model``: every embedding's weight, and ``head`` (the LM head's weight, where the
    model has one of its own), the parameters only ever looked up or multiplied by."""
    names = [f"{m}.weight" if m else "weight" for m, module in model.named_modules()
             if isinstance(module, nn.Embedding)]
    params = dict(model.named_parameters(remove_duplicate=False))
    return names + ([head] if head is not None and head in params else [])


class Streamed:
    """A model on the meta device, filled as it runs: ``blocks`` (submodule names) each filled by
    ``fill(block)`` when it starts running and emptied by ``empty(block)`` after each run (``solo``) or
    when the caller says (several passes in lockstep: see ``Lane``); ``tables`` (parameter name →
    reader) read by rows (``Rows``); everything else filled now, by ``fill(None)``.

    ``fill`` sets the parameters itself (ours from our key map, transformers' by its own loader);
    ``empty`` puts meta tensors back, so that a block is in memory only while it is in use.
    """

    def __init__(self, model: nn.Module, blocks: list[str], fill: Callable[[str | None], None],
                 tables: dict[str, RowReader], dtype: torch.dtype, solo: bool = True) -> None:
        self.model, self.blocks, self._fill = model, list(blocks), fill
        self.filled: set[str] = set()
        self.seconds = 0.0  # spent reading (filling blocks), for the timings a verify reports
        inside = {n for b in self.blocks for n, _ in model.get_submodule(b).named_parameters(prefix=b)}
        for first, group in tie_groups(model).items():
            table = next((tables[n] for n in group if n in tables), None)
            if table is not None and not inside & set(group):
                assign(model, group, Rows(tuple(model.get_parameter(first).shape), dtype, table))
        fill(None)
        for block in self.blocks:
            module = model.get_submodule(block)
            module.register_forward_pre_hook(lambda _m, _args, block=block: self.ensure(block))
            if solo:
                module.register_forward_hook(lambda _m, _args, _out, block=block: self.empty(block))

    def ensure(self, block: str) -> None:
        """``block``'s weights in memory (read if they are not)."""
        if block not in self.filled:
            start = time.perf_counter()
            self._fill(block)
            self.filled.add(block)
            self.seconds += time.perf_counter() - start

    def empty(self, block: str) -> None:
        """Give ``block``'s weights back: meta tensors of the same shapes and dtypes in their place."""
        module = self.model.get_submodule(block)
        for name, p in list(module.named_parameters()):
            owner, _, leaf = name.rpartition(".")
            (module.get_submodule(owner) if owner else module)._parameters[leaf] = nn.Parameter(
                torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
        self.filled.discard(block)


class Cancelled(BaseException):
    """Raised inside a lane's thread when its caller closes it before it finished."""


_here = threading.local()  # the lane whose thread this is
_arenas = [False]


def trim() -> None:
    """Give the heap's free memory back to the system (``malloc_trim``, where the C library is glibc):
    what a pass freed inside the heap would otherwise stay counted in this process, and the next
    model's pass would allocate beside it."""
    if _libc[0] is None:
        try:
            import ctypes
            _libc[0] = ctypes.CDLL(None)
            _libc[0].malloc_trim  # noqa: B018 - present on glibc only
        except (OSError, AttributeError):
            _libc[0] = False
    if _libc[0]:
        _libc[0].malloc_trim(0)


_libc: list = [None]


def _one_arena() -> None:
    """Lanes allocate from the main thread's heap: glibc gives each new thread an arena of its own, whose
    freed memory no other thread reuses (a dozen lanes held 0.25 GB more at the peak of a streamed verify
    that way). ``mallopt(M_ARENA_MAX, 1)``, once, where the C library is glibc."""
    if _arenas[0]:
        return
    _arenas[0] = True
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.mallopt(-8, 1)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def current_lane() -> Lane | None:
    """The lane running in this thread, if any (hooks use it to stop at a step)."""
    return getattr(_here, "lane", None)


class Lane:
    """One forward pass, run in a thread of its own that stops at each named step.

    ``forward()`` runs the pass and returns its logits; while it runs, ``stop(name, tensor)`` (called
    from a tap or a module hook, in the lane's thread) hands a step's output to the caller and waits.
    ``next()`` (in the caller's thread) lets the pass run to its next step and returns that step's
    (name, tensor), or ("logits", logits) once the pass has returned. Only one thread runs at a time:
    the caller, or one lane; so several lanes over the same modules take turns, block by block.
    """

    def __init__(self, forward: Callable[[], torch.Tensor], name: str = "") -> None:
        _one_arena()
        self.name = name
        self._forward = forward
        self._go, self._back = threading.Semaphore(0), threading.Semaphore(0)
        self._event: tuple[str, torch.Tensor] | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self.done = False
        self._thread = threading.Thread(target=self._run, name=f"lane {name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        _here.lane = self
        self._go.acquire()
        try:
            if self._cancelled:
                raise Cancelled
            with torch.no_grad():
                logits = self._forward()
            self._event = ("logits", logits)
        except Cancelled:
            self._event = None
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, raised there
            self._error = e
        finally:
            self.done = True
            self._forward = None  # what the pass held goes with it
            self._back.release()

    def stop(self, name: str, tensor: torch.Tensor) -> None:
        """In the lane's thread: hand ``tensor`` (step ``name``) over and wait to be resumed."""
        self._event = (name, tensor)
        self._back.release()
        self._go.acquire()
        if self._cancelled:
            raise Cancelled

    def next(self) -> tuple[str, torch.Tensor]:
        """Run the pass to its next step; that step's (name, tensor)."""
        if self.done:
            raise RuntimeError(f"lane {self.name}: the pass has already returned")
        self._go.release()
        self._back.acquire()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        event, self._event = self._event, None
        assert event is not None
        return event

    def close(self) -> None:
        """Stop the pass where it waits: it unwinds in its thread (not waited for: one interrupted inside
        a block finishes that block first, and its thread dies with the process); nothing happens to a
        finished one."""
        if not self.done and not self._cancelled:
            self._cancelled = True
            self._go.release()


def stop_here(name: str, tensor: torch.Tensor) -> None:
    """Hand a step to the caller of the lane this thread runs (nothing outside a lane)."""
    lane = current_lane()
    if lane is not None:
        lane.stop(name, tensor)
