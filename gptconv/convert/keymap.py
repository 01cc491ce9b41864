"""The key-mapping engine: one loop, driven by a table of rules per architecture.

A table maps source tensor names (patterns with ``{i}`` for the layer) to our parameter
names through a named transform. The engine keeps a ledger: every source tensor used
exactly once, every target parameter filled exactly once, every shape and dtype checked.
Anything else is a GptconvError naming the keys. The inverse map (ours → source names),
used by export, is read off the same table.

Usage::

    plan = GPT2_HF.plan(checkpoint.tensors, model_shapes(model), config, origin=folder)
    for target, tensor in plan.tensors(torch.float32):
        ...
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any, NamedTuple

import torch

from ..errors import GptconvError

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class Transform:
    """How a tensor changes between the source layout and ours; ``ctx`` is our model config."""

    name: str
    forward: Callable[[torch.Tensor, Any], torch.Tensor]  # source → ours
    inverse: Callable[[torch.Tensor, Any], torch.Tensor]  # ours → source
    shape: Callable[[tuple[int, ...], Any], tuple[int, ...]] = lambda s, ctx: s  # source shape → ours


IDENTITY = Transform("identity", lambda t, ctx: t, lambda t, ctx: t)
# HF's GPT-2 uses Conv1D, which stores a linear layer's weight as (in, out); nn.Linear wants (out, in).
# Import keeps a transposed view of the memory-mapped tensor (no copy: F.linear multiplies by the
# contiguous (in, out) matrix as fast as by an (out, in) one); export writes it contiguous again.
TRANSPOSE = Transform(
    "transpose",
    lambda t, ctx: t.t(),
    lambda t, ctx: t.t().contiguous(),
    lambda s, ctx: tuple(reversed(s)) if len(s) == 2 else (-1,),
)


@dataclass(frozen=True)
class Fuse:
    """Several of our parameters held as one source tensor: Phi-3's ``qkv_proj`` (q, k and v
    concatenated), GGUF's stacked experts. ``split`` gives the parts in the rule's target order
    (views, nothing copied); ``join`` is its inverse, for export."""

    name: str
    split: Callable[[torch.Tensor, Any], list[torch.Tensor]]  # source → our parts
    join: Callable[[list[torch.Tensor], Any], torch.Tensor]  # our parts → source
    shapes: Callable[[tuple[int, ...], Any], list[tuple[int, ...]]]  # source shape → our parts' shapes


def concat(name: str, sizes: Callable[[Any], list[int]], dim: int = 0) -> Fuse:
    """Parts of ``sizes(ctx)`` along ``dim``, one after the other."""
    def shapes(s: tuple[int, ...], ctx: Any) -> list[tuple[int, ...]]:
        if len(s) <= dim or sum(sizes(ctx)) != s[dim]:
            return [s]  # cannot be split so: the ledger reports the shape
        return [(*s[:dim], n, *s[dim + 1:]) for n in sizes(ctx)]
    return Fuse(name, lambda t, ctx: list(t.split(sizes(ctx), dim)), lambda ts, ctx: torch.cat(ts, dim), shapes)


STACK = Fuse("stack", lambda t, ctx: list(t.unbind(0)), lambda ts, ctx: torch.stack(ts),
             lambda s, ctx: [tuple(s[1:])] * s[0] if s else [s])


@dataclass(frozen=True)
class Rule:
    """One row of a table.

    kind "map": ``source`` fills ``target`` through ``transform`` (required).
    kind "drop": ``source`` is a buffer checkpoints carry (e.g. GPT-2's causal mask ``attn.bias``),
    recognised and dropped on purpose (optional).
    kind "tied": ``source`` is a second copy of ``target`` that some checkpoints store; it must
    equal that target's tensor (optional).
    kind "fused": ``source`` holds the targets ``parts(ctx)`` joined by ``fuse`` (required).
    """

    source: str
    target: str | None = None
    transform: Transform = IDENTITY
    kind: str = "map"
    fuse: Fuse | None = None
    parts: Callable[[Any], list[str]] | None = None  # kind "fused": the target templates, in order
    pattern: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Checked as it is written, ours and a user's alike: a bad row is one line naming it here, not a
        # KeyError, re.error or AttributeError from deep in the engine when a checkpoint meets it.
        if problem := self._problem():
            raise GptconvError(f"key map row {self}: {problem}")
        object.__setattr__(self, "pattern", _compile(self.source))

    def targets(self, ctx: Any) -> list[str]:
        return self.parts(ctx) if self.kind == "fused" else [self.target]

    def __str__(self) -> str:
        """The row as a table writes it, for errors: ``Map('h.{i}.ln_1.weight', 'blocks.{i}.norm1.weight')``."""
        maker = _MAKERS.get(self.kind) if isinstance(self.kind, str) else None
        if maker is None:
            return f"Rule({self.source!r}, {self.target!r}, kind={self.kind!r})"
        args = [repr(self.source)]
        if self.kind in ("map", "tied") or self.target is not None:
            args.append(repr(self.target))
        if self.kind == "map" and self.transform is not IDENTITY:
            args.append(getattr(self.transform, "name", None) or repr(self.transform))
        if self.kind == "fused" and self.fuse is STACK:
            maker = "Stacked"
        elif self.kind == "fused":
            args.append(getattr(self.fuse, "name", None) or repr(self.fuse))
        return f"{maker}({', '.join(args)})"

    def _problem(self) -> str | None:
        """What is wrong with this row on its own, if anything (checks across rows: KeyMap)."""
        if not isinstance(self.kind, str) or self.kind not in _MAKERS:
            return f"kind {self.kind!r} is none of {', '.join(_MAKERS)}"
        if not isinstance(self.source, str):
            return f"the source must be a str, not {type(self.source).__name__}"
        if problem := _template_problem(self.source):
            return f"the source {problem}"
        if self.kind == "map" and not isinstance(self.transform, Transform):
            return f"the transform must be a Transform (such as TRANSPOSE), not {type(self.transform).__name__}"
        if self.kind in ("map", "tied"):
            return _pair_problem(self.source, self.target)
        if self.target is not None:
            return f"a {_MAKERS[self.kind]} row has no target (it names {self.target!r})"
        if self.kind == "fused" and not (isinstance(self.fuse, Fuse) and callable(self.parts)):
            return "a fused row needs a Fuse and its parts: write it with Fused or Stacked"
        return None


_MAKERS = {"map": "Map", "drop": "Drop", "tied": "Tied", "fused": "Fused"}  # kind → the function that writes it
_FIELD = re.compile(r"\{([A-Za-z_]\w*)\}")  # {i}: the layer; {j}: an expert


def _template_problem(template: str) -> str | None:
    """What keeps ``template`` from being read alike by ``_compile`` (a regex, a group per field) and by
    ``str.format`` (the name it writes), if anything: an empty name, a brace that is no field ({0}, a
    lone '{'), a field twice."""
    if not template:
        return "is empty"
    if stray := re.search(r"\{[^{}]*\}|[{}]", _FIELD.sub("", template)):
        return (f"has '{stray.group()}', which is not a field: a field is a name in braces, {{i}} for the layer"
                if len(stray.group()) > 1 else f"has a '{stray.group()}' that opens or closes no field")
    fields = _FIELD.findall(template)
    if twice := next((f for f in fields if fields.count(f) > 1), None):
        return f"has '{{{twice}}}' twice"
    return None


def _fields(template: str) -> set[str]:
    return set(_FIELD.findall(template))


def _pair_problem(source: str, target: object, numbered: str | None = None) -> str | None:
    """What is wrong with ``target`` as a target of ``source`` (a valid template), if anything. Both must
    have the same fields: a field only in the source gives many source tensors one target, one only in the
    target many targets one source name (every layer's norm under 'ln.weight'), and neither name can be
    written from the other (a KeyError from str.format). ``numbered``: a field of the target that the row
    writes out itself (Stacked's ``{j}``, one part each), which it must have."""
    if not isinstance(target, str):
        return f"the target must be a str (one of our parameter names), not {type(target).__name__}"
    if problem := _template_problem(target):
        return f"the target {problem}"
    fields = _fields(target)
    if numbered is not None:
        if numbered not in fields:
            return f"the target has no '{{{numbered}}}' to number its parts"
        fields.discard(numbered)
    one_side = [(f"'{{{f}}}' is in the {side} only") for side, fs in
                (("source", _fields(source) - fields), ("target", fields - _fields(source))) for f in sorted(fs)]
    if one_side:
        return (f"{' and '.join(one_side)}: a field must be in both names, to say which tensor of one is which "
                f"of the other")
    return None


def Map(source: str, target: str, transform: Transform = IDENTITY) -> Rule:
    return Rule(source, target, transform)


def Drop(source: str) -> Rule:
    return Rule(source, kind="drop")


def Tied(source: str, target: str) -> Rule:
    return Rule(source, target, kind="tied")


def Fused(source: str, targets: list[str], fuse: Fuse) -> Rule:
    """One source tensor, several of our parameters (``targets`` in the order ``fuse`` splits)."""
    rule = Rule(source, kind="fused", fuse=fuse, parts=lambda ctx: list(targets))
    if not isinstance(targets, (list, tuple)) or not targets:  # a str would be split into letters
        raise GptconvError(f"key map row {rule}: its targets must be a list of our parameter names, "
                           f"not {reprlib.repr(targets)}")
    for n, target in enumerate(targets):
        if problem := _pair_problem(source, target) or (target in targets[:n] and "it is listed twice"):
            raise GptconvError(f"key map row {rule}, target {target!r}: {problem}")
    return rule


def Stacked(source: str, target: str, count: Callable[[Any], int]) -> Rule:
    """``count(ctx)`` of our parameters stacked along a new first dimension; ``target`` names
    the part with ``{j}`` (GGUF's ``ffn_gate_exps``: one tensor for every expert of a layer)."""
    rule = Rule(source, kind="fused", fuse=STACK,
                parts=lambda ctx: [target.replace("{j}", str(j)) for j in range(count(ctx))])
    problem = _pair_problem(source, target, numbered="j")
    if problem is None and not callable(count):
        problem = f"its count must be a function of the config, not {type(count).__name__}"
    if problem:
        raise GptconvError(f"key map row {rule}, target {target!r}: {problem}")
    return rule


class Inverse(NamedTuple):
    """How an export writes one source tensor: its name, our parameters in it, and the join."""

    name: str
    parts: tuple[str, ...]
    join: Callable[[list[torch.Tensor], Any], torch.Tensor]


@cache
def _compile(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", template)
    regex = "".join(re.escape(p) if n % 2 == 0 else rf"(?P<{p}>\d+)" for n, p in enumerate(parts))
    return re.compile(regex)


@dataclass(frozen=True)
class TensorInfo:
    """What the engine needs to know of a source tensor before reading it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]  # reads the tensor (from a memory map where the format allows)
    stored: str = ""  # how the file stores it where that is not ``dtype`` (MXFP4: a pair, dequantized when read)
    # reads some of its rows alone (a slice, or sorted ids) where the format can do better than reading it all
    # (a GGUF file: only those rows' blocks); None: ``load()`` and index (a memory map reads only those pages)
    rows: Callable[[slice | torch.Tensor], torch.Tensor] | None = None

    def read_rows(self, index: slice | torch.Tensor) -> torch.Tensor:
        """Rows ``index`` of this (2-D) tensor."""
        return self.rows(index) if self.rows is not None else self.load()[index]


@dataclass
class Plan:
    """The checked ledger: which source fills which target, built before any tensor is read."""

    keymap: KeyMap
    ctx: Any
    moves: list[tuple[str, str, Transform]]  # (source key, target name, transform)
    tied: list[tuple[str, str]]  # (source key, target name)
    dropped: list[str]
    sources: Mapping[str, TensorInfo]
    layout: str
    origin: object
    _last: tuple[str, torch.Tensor] | None = field(default=None, repr=False)

    def tensors(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (target name, tensor in our layout and ``dtype``), one tensor at a time."""
        for _, target, _ in self.moves:
            yield target, self.tensor(target, dtype)

    def tensor(self, target: str, dtype: torch.dtype) -> torch.Tensor:
        """Our parameter ``target``, read from the source, in our layout and ``dtype``."""
        key, transform = self._by_target[target]
        tensor = transform.forward(self._load(key), self.ctx)
        if target in self._tied_of:
            copy = transform.forward(self.sources[self._tied_of[target]].load(), self.ctx)
            if not torch.equal(copy, tensor):
                raise GptconvError(f"{self.origin}: tensor '{self._tied_of[target]}' should be a tied copy "
                                   f"of '{key}' but differs from it")
        if tensor.dtype == dtype:
            return tensor  # as read: a view of the mapped file where the layout allows
        # converted, so copied anyway: into (out, in) row order, which the one-row bfloat16 gemv needs
        return tensor.to(dtype, memory_format=torch.contiguous_format)

    def row_reader(self, target: str, dtype: torch.dtype) -> Callable[[slice | torch.Tensor], torch.Tensor] | None:
        """Rows of our parameter ``target`` read alone, in ``dtype``, where its rows are the source
        tensor's rows as they are (a table moved by name: an embedding, a head); None where they are
        not (a transform that mixes rows, a fused tensor)."""
        key, transform = self._by_target[target]
        if transform is not IDENTITY or len(self.sources[key].shape) != 2:
            return None
        info, copy = self.sources[key], self._tied_of.get(target)

        def rows(index: slice | torch.Tensor) -> torch.Tensor:
            tensor = info.read_rows(index)
            if copy is not None and not torch.equal(self.sources[copy].read_rows(index), tensor):
                raise GptconvError(f"{self.origin}: tensor '{copy}' should be a tied copy of '{key}' but differs from it")
            return tensor.to(dtype, memory_format=torch.contiguous_format)
        return rows

    def forget(self) -> None:
        """Let go of the source tensor kept from the last read (see ``_load``)."""
        self._last = None

    def source_of(self, target: str) -> str:
        """The source tensor our parameter ``target`` is read from (a fused one: the whole)."""
        return self._by_target[target][0]

    def _load(self, key: str) -> torch.Tensor:
        """The source tensor ``key``; the last one read is kept, so the parts of a fused tensor
        (asked for one after the other) read it once."""
        if self._last is None or self._last[0] != key:
            self._last = None  # let the previous tensor go before reading the next
            self._last = (key, self.sources[key].load())
        return self._last[1]

    @cached_property
    def _by_target(self) -> dict[str, tuple[str, Transform]]:
        return {target: (key, transform) for key, target, transform in self.moves}

    @cached_property
    def _tied_of(self) -> dict[str, str]:
        return {target: key for key, target in self.tied}


def _part(fuse: Fuse, k: int) -> Transform:
    """Part ``k`` of a fused source tensor, as a transform of the whole (export joins, not inverts)."""
    def inverse(t: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise AssertionError(f"part {k} of '{fuse.name}' is written by joining its parts")
    return Transform(f"{fuse.name}[{k}]", lambda t, ctx: fuse.split(t, ctx)[k], inverse)


class KeyMap:
    def __init__(self, name: str, rules: Iterable[Rule], legacy_prefix: str | None = None) -> None:
        """``legacy_prefix``: a prefix some checkpoints of this family leave off every key
        (GPT-2's original files say ``h.0.attn.c_attn.weight`` for ``transformer.h.0…``).

        The rows are checked together here, as each was on its own when written: one source name, one
        tensor (a Tied row may repeat a Map row's name: the same tensor under a second name)."""
        if not isinstance(name, str):
            raise GptconvError(f"key map {reprlib.repr(name)}: its name must be a str, not {type(name).__name__}")
        if not isinstance(rules, Iterable) or isinstance(rules, (str, bytes, Mapping)):
            raise GptconvError(f"key map {name}: its rows must be a list of Map, Tied, Drop, Fused or Stacked "
                               f"rows, not {type(rules).__name__}")
        rules = list(rules)
        for n, rule in enumerate(rules, 1):
            if not isinstance(rule, Rule):
                raise GptconvError(f"key map {name}: row {n} is {reprlib.repr(rule)}, not a row: write "
                                   f"Map(source, target), Tied, Drop, Fused or Stacked")
        if legacy_prefix is not None and not isinstance(legacy_prefix, str):
            raise GptconvError(f"key map {name}: legacy_prefix must be a str, not {type(legacy_prefix).__name__}")
        filling: dict[str, Rule] = {}
        for rule in rules:
            if rule.kind not in ("map", "fused"):
                continue
            if (first := filling.setdefault(rule.source, rule)) is not rule:
                raise GptconvError(f"key map {name}: '{rule.source}' is given two targets, {_targets_of(first)} "
                                   f"and {_targets_of(rule)}: one name holds one tensor")
        self.name = name
        self.rules = rules
        self.legacy_prefix = legacy_prefix

    def match(self, key: str) -> tuple[Rule, dict[str, str]] | None:
        """The row for source tensor ``key``: where a row naming more of it outright (fewer fields) and a
        pattern both fit (GGUF's MTP block ``blk.24.attn_q`` and the trunk's ``blk.{i}.attn_q``; a dropped MTP
        layer's ``model.layers.61.mlp.experts.{j}…`` and the trunk's ``model.layers.{i}.mlp.experts.{j}…``),
        the more outright one."""
        hits = [(r, m.groupdict()) for r in self.rules if (m := r.pattern.fullmatch(key))]
        if len(hits) > 1:
            fewest = min(len(h[1]) for h in hits)
            hits = [h for h in hits if len(h[1]) == fewest]
        if len(hits) > 1:
            raise AssertionError(f"key map {self.name}: '{key}' matches {len(hits)} rules")
        return hits[0] if hits else None

    def rule_for(self, target: str, ctx: Any) -> tuple[Rule, dict[str, str]]:
        """The rule that fills our parameter ``target``, and the layer (``{i}``) it matched."""
        for rule in self.rules:
            if rule.kind in ("map", "fused"):
                for template in rule.targets(ctx):
                    if m := _compile(template).fullmatch(target):
                        return rule, m.groupdict()
        raise GptconvError(f"key map {self.name}: no rule produces '{target}'")

    def source_name(self, target: str, ctx: Any = None) -> tuple[str, Transform]:
        """The inverse map: our parameter name → (source name, transform to invert)."""
        rule, groups = self.rule_for(target, ctx)
        return rule.source.format(**groups), rule.transform

    def inverse(self, targets: list[str], ctx: Any) -> list[Inverse]:
        """Our parameters grouped as this format stores them, in the order of their first part:
        each source tensor's name, the parameters it holds, and how to join them back. Two tensors
        under one name are an error (rows whose names overlap, ``h.{i}.ln`` and ``h.0.ln``): a dict
        or a file would keep one and lose the other without a word."""
        out, done = [], set()
        named: dict[str, tuple[tuple[str, ...], Rule]] = {}
        for target in targets:
            if target in done:
                continue
            rule, groups = self.rule_for(target, ctx)
            if rule.kind == "fused":
                parts = tuple(t.format(**groups) for t in rule.parts(ctx))
                join = rule.fuse.join
            else:
                parts, join = (target,), (lambda ts, c, t=rule.transform: t.inverse(ts[0], c))
            name = rule.source.format(**groups)
            missing = [p for p in parts if p not in targets]
            if missing:
                raise GptconvError(f"key map {self.name}: '{name}' needs {missing}")
            if name in named:
                first, by = named[name]
                rows = f"row {rule}" if by is rule else f"rows {by} and {rule}"
                raise GptconvError(f"key map {self.name}: '{name}' is given two targets, {_few_names(first)} and "
                                   f"{_few_names(parts)} ({rows}): one name holds one tensor")
            named[name] = (parts, rule)
            done.update(parts)
            out.append(Inverse(name, parts, join))
        return out

    def check_layout(self, targets: Collection[str], inert: Collection[str], ctx: Any) -> None:
        """This table read backwards as the names of someone's module (``state_dict(source, KeyMap)``):
        every row's targets are the model's parameters, and each of ``targets`` (the parameters to fill)
        has one row giving it a name. ``inert``: names a row may target that this model lacks (our head
        when it is the embedding: a table written for tied and untied checkpoints keeps its head row).

        Only for users' tables: ours may read two layouts of one tensor (Mixtral's experts, fused or
        not), and name it, for export, by their first row."""
        fills: dict[str, list[tuple[Rule, str]]] = {t: [] for t in targets}
        for rule in self.rules:
            if rule.kind == "drop":
                continue
            try:
                templates = list(rule.targets(ctx))
            except Exception as e:  # noqa: BLE001 - a user's part count or parts, run on this config
                raise GptconvError(f"key map {self.name}: row {rule} cannot list its targets for this model: "
                                   f"{type(e).__name__}: {e}") from None
            for template in templates:
                if problem := _pair_problem(rule.source, template):  # Fused's parts were checked; a Rule's not
                    raise GptconvError(f"key map {self.name}: row {rule}, target {template!r}: {problem}")
                pattern = _compile(template)
                hits = [t for t in fills if pattern.fullmatch(t)]
                if not hits and not any(pattern.fullmatch(t) for t in inert):
                    raise GptconvError(f"key map {self.name}: row {rule}: the model has no parameter '{template}'")
                if rule.kind != "tied":  # a Tied row is a second name for its target, on purpose
                    for t in hits:
                        fills[t].append((rule, template))
        for target, rows in fills.items():
            if len(rows) > 1:
                (a, ta), (b, tb) = rows[:2]
                names = [r.source.format(**_compile(t).fullmatch(target).groupdict()) for r, t in ((a, ta), (b, tb))]
                rows_text = f"row {a}" if a is b else f"rows {a} and {b}"  # a fused row listing a part twice
                raise GptconvError(f"key map {self.name}: our '{target}' is given two names, '{names[0]}' and "
                                   f"'{names[1]}' ({rows_text}): a second name for one tensor is a Tied row")

    def plan(
        self,
        sources: Mapping[str, TensorInfo],
        targets: Mapping[str, tuple[int, ...]],
        ctx: Any,
        origin: object,
    ) -> Plan:
        """Check the whole mapping (names, counts, shapes, dtypes) without reading any tensor."""
        sources, layout = self._canonical(sources)
        problems: dict[str, list[str]] = {}

        def problem(kind: str, text: str) -> None:
            problems.setdefault(kind, []).append(text)

        moves, tied, dropped = [], [], []
        filled: dict[str, str] = {}
        for key, info in sources.items():
            hit = self.match(key)
            if hit is None:
                problem("unexpected tensor", f"'{key}'")
                continue
            rule, groups = hit
            if rule.kind == "drop":
                dropped.append(key)
                continue
            names = [t.format(**groups) for t in rule.targets(ctx)]
            if absent := [n for n in names if n not in targets]:
                problem("tensor the model has no place for", f"'{key}' → {', '.join(repr(n) for n in absent)}")
                continue
            if info.dtype not in FLOAT_DTYPES:
                problem("non-float tensor", f"'{key}' is {info.dtype}")
                continue
            if rule.kind == "tied":
                tied.append((key, names[0]))
                continue
            if twice := [n for n in names if n in filled]:
                problem("target filled twice", f"'{twice[0]}' from '{filled[twice[0]]}' and '{key}'")
                continue
            if rule.kind == "fused":
                shapes = rule.fuse.shapes(tuple(info.shape), ctx)
                transforms = [_part(rule.fuse, k) for k in range(len(names))]
                how = f" ({rule.fuse.name} of {len(names)})"
            else:
                shapes = [rule.transform.shape(tuple(info.shape), ctx)]
                transforms = [rule.transform]
                how = f" after {rule.transform.name}" if rule.transform is not IDENTITY else ""
            wanted = [list(targets[n]) for n in names]
            if [list(s) for s in shapes] != wanted:
                needs = ", ".join(f"'{n}' needs {w}" for n, w in zip(names, wanted))
                problem("wrong shape", f"'{key}' is {list(info.shape)}, {needs}{how}")
            for name, transform in zip(names, transforms):
                filled[name] = key
                moves.append((key, name, transform))
        for key, target in tied:
            if target not in filled:
                problem("tied copy without its original", f"'{key}'")
            elif tuple(sources[key].shape) != tuple(sources[filled[target]].shape):
                problem("wrong shape", f"tied copy '{key}' is {list(sources[key].shape)}")
        for target in targets:
            if target not in filled:
                try:
                    problem("missing tensor", f"'{self.source_name(target, ctx)[0]}' (for '{target}')")
                except GptconvError:  # a part the config asks for that this format's checkpoints never hold
                    problem("part its config asks for that no row reads", f"'{target}'")
        if problems:
            raise GptconvError(f"{origin}: does not map onto {self.name}: " + "; ".join(
                f"{kind}: {_few(items)}" for kind, items in problems.items()))
        return Plan(self, ctx, moves, tied, dropped, sources, layout, origin)

    def _canonical(self, sources: Mapping[str, TensorInfo]) -> tuple[Mapping[str, TensorInfo], str]:
        p = self.legacy_prefix
        if p is None or any(k.startswith(p) for k in sources):
            return sources, "standard"
        renamed = {k if self.match(k) else p + k: v for k, v in sources.items()}
        return renamed, f"legacy (no '{p}' prefix)"


def _targets_of(rule: Rule) -> str:
    """A row's targets, for errors: a Map's one, or the Fused row itself (its parts depend on the config)."""
    return f"'{rule.target}'" if rule.kind == "map" else f"those of {rule}"


def _few_names(names: tuple[str, ...]) -> str:
    return " + ".join(f"'{n}'" for n in names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")


def _few(items: list[str], n: int = 4) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def model_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Every parameter a checkpoint must fill (tied parameters once)."""
    return {name: tuple(p.shape) for name, p in model.named_parameters()}
