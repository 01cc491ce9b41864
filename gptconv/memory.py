"""The memory a command will need, predicted before anything loads, against the memory there is.

Every command that runs a model states its plan (``Need``): the bytes of each part it holds at its
peak, from the config (its parameter counts, read off our model built on the meta device), the dtype,
the input length and the mode (whole, or streamed: ``gptconv.streaming``). ``check`` compares the
peak with what the machine has (``MemAvailable`` and what this process already holds), or with the
cap ``GPTCONV_MEMORY_LIMIT`` sets (``8GB``, ``512MB``, bytes), and where the plan does not fit refuses
in one line that says what it needs, what there is, and what would fit: a user never meets the
kernel's OOM killer. ``verify`` and ``trace`` choose to stream by the same prediction.

The predictions are held to measured peaks (``VmHWM``) in the suite; the constants below are what
those measurements fit (glibc's heap and transient copies that a count of tensors alone misses).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .errors import GptconvError

ENV = "GPTCONV_MEMORY_LIMIT"
GB = 1e9
TRANSFORMERS_IMPORT = 110e6  # what importing transformers' model code adds to a process (measured: 105 MB)
LLAMA_CPP_IMPORT = 40e6
SLICE_BYTES = 64 << 20  # gptconv.streaming.SLICE_BYTES
ATTENTION_COPIES = 4  # eager attention: the scores, masked, their float32 softmax and its cast back, at once
MLP_COPIES = 3  # the gate, the up projection and their product
RESIDUAL_COPIES = 8  # the block's input, normed input, q, k, v, attention output, sublayer outputs


def parse_bytes(text: str, what: str = ENV) -> int:
    """``8GB``, ``512 MiB``, ``3e9``: a number of bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMgGtT]?)(i?)[bB]?\s*", text)
    if m is None:
        raise GptconvError(f"{what}={text!r}: expected a size such as 8GB, 512MB or 3e9 (bytes)")
    value, unit, binary = m.groups()
    scale = (1024 if binary else 1000) ** " KMGT".index(unit.upper() or " ")
    return int(float(value) * scale)


def limit() -> int | None:
    """The cap ``GPTCONV_MEMORY_LIMIT`` sets on the memory a plan may assume, if any."""
    value = os.environ.get(ENV, "").strip()
    return parse_bytes(value) if value else None


def resident() -> int:
    """This process's resident memory now."""
    return _status("VmRSS:")


def peak() -> int:
    """This process's peak resident memory so far (``VmHWM``)."""
    return _status("VmHWM:")


def reset_peak() -> bool:
    """Start this process's peak (``VmHWM``) anew from what it holds now (Linux's ``clear_refs``), so that
    the peak of a phase can be read apart from the one before it; False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def machine() -> int:
    """The memory this process may reach on this machine: what it holds and what the machine has free
    (``MemAvailable``: free memory and page cache it can reclaim)."""
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        pass
    if free is None:
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return resident() + free


def available() -> int:
    """The memory a plan may assume: ``machine()``, or the cap ``GPTCONV_MEMORY_LIMIT`` sets where lower."""
    cap = limit()
    return machine() if cap is None else min(machine(), cap)


@dataclass
class Need:
    """A command's predicted peak: ``base`` (what the process holds before it loads anything) and its
    phases, each a named set of parts in bytes; the peak is the base plus the largest phase."""

    what: str
    base: int
    phases: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return self.base + max((sum(p.values()) for p in self.phases.values()), default=0)

    def largest(self) -> tuple[str, dict[str, int]]:
        return max(self.phases.items(), key=lambda kv: sum(kv[1].values()))

    def describe(self) -> str:
        """Where the peak goes: its largest parts."""
        _, parts = self.largest()
        top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
        return ", ".join(f"{name} {gb(n)}" for name, n in top if n >= 1e6)


def gb(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= 0.95e8 else f"{n / 1e6:.0f} MB"


def check(need: Need, alternatives: list[tuple[str, Callable[[], Need]]] = ()) -> None:
    """Refuse, in one line, a plan whose peak exceeds what is available: what it needs and where it
    goes, what there is, and which of ``alternatives`` (an option and its plan) would fit."""
    have = available()
    if need.peak <= have:
        return
    others = [(option, plan().peak) for option, plan in alternatives]
    fits = [f"{option} (about {gb(peak)})" for option, peak in others if peak <= have]
    cap = limit()
    capped = f" (capped by {ENV})" if cap is not None and cap < machine() else ""
    smallest = min(others, key=lambda o: o[1], default=None)
    advice = (f"; it would fit with {' or '.join(fits)}" if fits else
              f"; the smallest plan, {smallest[0]}, needs about {gb(smallest[1])}" if smallest else "")
    raise GptconvError(f"{need.what} needs about {gb(need.peak)} of memory ({need.describe()}), "
                       f"{gb(have)} are available{capped}{advice}")


# ---------------------------------------------------------------------------------------------------
# What a model holds: parameter counts from our model built on meta, activations from its config

@dataclass(frozen=True)
class Shape:
    """What the predictions need to know of a model, read once."""

    params: int  # every parameter our model holds (a tied head once)
    block: int  # the largest block's parameters
    tables: int  # embedding and head (and other lookup tables): read by rows when streamed
    rest: int  # everything outside the blocks and the tables
    n_layers: int
    d_model: int
    vocab: int
    heads: int
    d_ff: int
    largest: int  # the largest single tensor's elements

    @classmethod
    def of(cls, config: object) -> Shape:
        from .models import build_empty
        from .streaming import table_names, tie_groups
        model = build_empty(config)
        groups = tie_groups(model)
        numel = {first: model.get_parameter(first).numel() for first in groups}
        blocks = [f"blocks.{i}" for i in range(config.n_layers)]
        per_block = [sum(p.numel() for p in model.get_submodule(b).parameters()) for b in blocks]
        head = "lm_head.weight" if any(n == "lm_head.weight" for n in numel) else None
        tables = set(table_names(model, head))
        mtp = sum(p.numel() for p in model.mtp.parameters()) if getattr(model, "mtp", None) is not None else 0
        table = sum(n for first, n in numel.items() if set(groups[first]) & tables and not first.startswith("blocks."))
        params = sum(numel.values())
        return cls(params, max(per_block, default=0), table, params - sum(per_block) - table - mtp, config.n_layers,
                   config.d_model, config.vocab_size, getattr(config, "n_heads", 1),
                   _d_ff(config), max(numel.values(), default=0))


def _d_ff(config: object) -> int:
    """The widest MLP a block holds: its dense one, an expert, a shared expert."""
    e = getattr(config, "experts", None)  # routed experts (``mlp.Experts``: the decoder's, Gemma 4's)
    sizes = [getattr(config, "d_ff", 0), *((e.d_ff, e.shared_d_ff) if e else ())]
    return max(n or 0 for n in sizes)


def forward_bytes(s: Shape, length: int, itemsize: int, batch: int = 1, eager: bool = True) -> int:
    """A forward pass's transient memory inside its largest block: ``eager`` attention (transformers')
    holds its scores over ``length`` positions several times over, ours (torch's fused attention, or
    its scores spelled out where that cannot run: soft caps, sinks) at most once."""
    attention = (ATTENTION_COPIES if eager else 1) * batch * s.heads * length * length * itemsize
    mlp = MLP_COPIES * batch * length * s.d_ff * itemsize
    return max(attention, mlp) + RESIDUAL_COPIES * batch * length * s.d_model * itemsize


def head_bytes(s: Shape, length: int, itemsize: int, batch: int = 1) -> int:
    """The logits of one pass (batch × length × vocabulary)."""
    return batch * length * s.vocab * itemsize


# ---------------------------------------------------------------------------------------------------
# The commands' plans

def verify_need(name: str, s: Shape, lengths: list[int], dtype: torch.dtype, stored: int, streamed: bool,
                shared: bool = False, reference: str = "transformers", held: int = 0) -> Need:
    """verify: ours beside a reference on inputs of ``lengths``, the runs in lockstep (one step of one
    model at a time; ``gptconv.parity.lockstep``). ``reference``: "transformers" (its float64 truth and
    its run in our dtype live: transformers' import, their weights, the truth's logits held for the
    others), "llama.cpp" (its float32 logits of every input held, ours in float32 and in float64, whose
    logits measure our own rounding), "recorded" (a file of
    ``held`` bytes read whole), or "record" (``gptconv reference``: transformers' runs in float64,
    float32 and ``dtype``, every step of every input kept). ``stored``: the bytes of a weight as the
    reference reads it (the file's dtype; a GGUF's dequantized float32); ``shared``: an fp32 folder
    verified in fp32, whose weights ours and the reference share."""
    b, longest, total = dtype.itemsize, max(lengths), sum(lengths)
    live = reference in ("transformers", "record")
    base = resident() + (TRANSFORMERS_IMPORT if live else LLAMA_CPP_IMPORT if reference == "llama.cpp" else 0)
    mode = "streamed" if streamed else "whole"
    what = "reference" if reference == "record" else "verify"
    need = Need(f"{what} of {name} ({str(dtype).removeprefix('torch.')}, {mode})", base)
    if reference == "record":  # every step of every input, from each run
        sizes = sorted({8, 4, b})
        models = [(size, f"{size * 8}-bit run") for size in sizes]
        steps = sum(total * (s.n_layers + 2) * s.d_model * size + total * s.vocab * size for size in sizes)
        held_steps, truth_logits = steps, 0
    else:
        models = [(8, "float64 truth"), (b, "reference"), (b, "ours")] if live else \
            [(8, "our float64 run"), (b, "ours")] if reference == "llama.cpp" else [(b, "ours")]
        held_steps = total * s.d_model * 8  # the truth's step in hand, of every input
        # the truth's logits of every input (llama.cpp's in float32 and our float64 run's), or a file's
        truth_logits = total * s.vocab * (8 if live else 12 if reference == "llama.cpp" else 4) + held
    # a run's logits, and their float32 copy where they are not float32 (the truth's are the ones held)
    one_logits = head_bytes(s, longest, 4) + (head_bytes(s, longest, b) if b != 4 else 0)
    kl = 2 * 8 * s.vocab * 8
    if streamed:
        rest = sum(s.rest * size for size, _ in models)
        for size, who in models:
            need.phases[f"{who}'s block"] = {
                "block": s.block * size, "block as read": s.largest * size if who.startswith("our") else s.block * stored,
                "activations": forward_bytes(s, longest, size, eager=who != "ours"), "steps held": held_steps,
                "rest": rest}
        need.phases["logits"] = {"logits held": truth_logits, "a run's logits": one_logits,
                                 "head slices": 2 * SLICE_BYTES, "KL": kl, "rest": rest}
        return need
    weights = {"ours": s.params * b} if reference != "record" else {}
    if reference == "llama.cpp":
        weights["our float64 run"] = s.params * 8
    if live:  # the reference's tables are read by rows even when it is whole
        for size, who in models:
            if who != "ours":
                weights[who] = 0 if shared and size == 4 else (s.params - s.tables) * size
    need.phases["run"] = {**weights, "activations": forward_bytes(s, longest, 8 if live else b),
                          "steps held": held_steps, "logits held": truth_logits, "a run's logits": one_logits}
    return need


def model_need(what: str, s: Shape, dtype: torch.dtype, base: int | None = None) -> Need:
    """Our model loaded whole (``gptconv.load``)."""
    need = Need(what, resident() if base is None else base)
    need.phases["load"] = {"weights": s.params * dtype.itemsize, "a tensor converted": s.largest * 4}
    return need


def generate_need(name: str, s: Shape, cache: int, dtype: torch.dtype, prompt: int, batch: int = 1) -> Need:
    """generate: our model whole, its KV cache (``cache`` bytes at its largest), a prefill's activations;
    never less than its load (the weights and one tensor converted), which it checks first."""
    b = dtype.itemsize
    need = Need(f"generate with {name} ({str(dtype).removeprefix('torch.')})", resident())
    need.phases["prefill"] = {"weights": s.params * b, "KV cache": cache,
                              "activations": forward_bytes(s, prompt, b, batch),
                              "logits": batch * s.vocab * 8}
    need.phases["load"] = {"weights": s.params * b, "a tensor converted": s.largest * 4}  # as model_need
    return need


def trace_need(name: str, s: Shape, dtype: torch.dtype, length: int, streamed: bool) -> Need:
    """trace: one forward pass, our model whole or streamed; every step's statistics."""
    b = dtype.itemsize
    need = Need(f"trace of {name} ({str(dtype).removeprefix('torch.')}, {'streamed' if streamed else 'whole'})",
                resident())
    weights = {"block": s.block * b, "rest": s.rest * b, "head slices": 2 * SLICE_BYTES} if streamed else \
        {"weights": s.params * b}
    need.phases["run"] = {**weights, "activations": forward_bytes(s, length, b), "logits": head_bytes(s, length, b)}
    return need


def perplexity_need(name: str, s: Shape, dtype: torch.dtype, ctx: int, base_model: bool) -> Need:
    """perplexity: our model whole (and a base model in float32), a window's logits in float64."""
    b = dtype.itemsize
    need = Need(f"perplexity of {name} ({str(dtype).removeprefix('torch.')})", resident())
    need.phases["window"] = {"weights": s.params * b + (s.params * 4 if base_model else 0),
                             "activations": forward_bytes(s, ctx, b),
                             "logits": head_bytes(s, ctx, 8) * (2 if base_model else 1) + head_bytes(s, ctx, b)}
    return need


def export_need(name: str, s: Shape, stored: int, out: int) -> Need:
    """export: one tensor at a time, read, converted and written behind."""
    need = Need(f"export of {name}", resident())
    need.phases["tensor"] = {"a tensor read": s.largest * max(stored, 4), "converted": s.largest * max(out, 4),
                             "written behind": s.largest * max(out, 1)}
    return need


def kv_cache_bytes(config: object, positions: int, dtype: torch.dtype, batch: int = 1) -> int:
    """The bytes of our KV cache (every layer's slot, as its attention makes it) at ``positions``."""
    from .layers.kv_cache import KVCache
    from .models import build_empty
    model = build_empty(config)
    cache = KVCache.for_model(_as(model, dtype), batch, positions, positions)
    return sum(t.numel() * t.element_size() for slot in cache.layers for t in _tensors(slot))


def _as(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    return model.to(dtype) if next(model.parameters()).dtype != dtype else model


def _tensors(slot: object) -> list[torch.Tensor]:
    seen, out = set(), []
    for value in vars(slot).values():
        for t in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


