"""A catalog of conversion bugs, each a realistic mistake a converter makes, planted in a correct model.

Each bug changes our loaded model the way the mistake would have left it (its weights, its config, or
one of its functions), never the reference. ``applies`` says on which fixtures the mistake can exist
at all (a Q/K permutation only where llama.cpp permutes, a transposed weight only where one is square:
elsewhere the ledger's shape check already refuses it); ``first`` names the step where it must first
show, in our step names.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn

from gptconv.convert.gguf_decoder import _permute
from gptconv.layers.decoder import DecoderConfig


@dataclass(frozen=True)
class Case:
    """A fixture of the catalog: a checkpoint and what its model has."""

    name: str
    arch: str  # our architecture: gpt2, llama, gemma3
    family: str  # the HF model_type
    tied: bool = False
    window: bool = False
    scaled: bool = False  # RoPE scaling (llama3 or linear)
    softcap: bool = False
    experts: bool = False
    biases: bool = False


@dataclass(frozen=True)
class Bug:
    name: str
    applies: Callable[[Case, nn.Module], bool]
    plant: Callable[[nn.Module, Case], contextlib.AbstractContextManager]  # context: the model is buggy inside
    first: Callable[[Case, nn.Module], str]  # the first step that must diverge


def _block_step(case: Case, layer: int, gemma_step: str) -> str:
    """Where a change inside layer ``layer`` first shows: the block, or for Gemma 3 (whose steps inside a
    block are compared too) its first inner step after the change."""
    return f"block.{layer}.{gemma_step}" if case.arch == "gemma3" else f"block.{layer}"


def _first_step(gemma_step: str, layer: int = 0) -> Callable[[Case, nn.Module], str]:
    return lambda case, model: _block_step(case, layer, gemma_step)


@contextlib.contextmanager
def _edit(*params_and_values) -> Iterator[None]:
    """Set parameters to new values inside the context; restore them after."""
    saved = [(p, p.detach().clone()) for p, _ in params_and_values]
    new = [(p, v.detach().clone()) for p, v in params_and_values]  # all read before any is written (swaps)
    with torch.no_grad():
        for p, value in new:
            p.copy_(value)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, old in saved:
                p.copy_(old)


@contextlib.contextmanager
def _set(obj: object, **values) -> Iterator[None]:
    """Set attributes inside the context (a frozen config is replaced whole); restore them after."""
    old = {k: getattr(obj, k) for k in values}
    for k, v in values.items():
        object.__setattr__(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            object.__setattr__(obj, k, v)


@contextlib.contextmanager
def _config(model: nn.Module, **changes) -> Iterator[None]:
    """The model's config with ``changes``, RoPE frequencies recomputed from it."""
    with _set(model, config=dataclasses.replace(model.config, **changes)):
        model._inv_freq.clear()
        try:
            yield
        finally:
            model._inv_freq.clear()


def _model_module(model: nn.Module):
    import importlib
    return importlib.import_module(type(model).__module__)


@contextlib.contextmanager
def _patch(module, name: str, value) -> Iterator[None]:
    with _set(module, **{name: value}):
        yield


def _blocks(model: nn.Module) -> list[nn.Module]:
    return list(model.blocks)


def _norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "eps") and isinstance(getattr(m, "weight", None), nn.Parameter)]


# --- the bugs -------------------------------------------------------------------------------------

def _unpermuted_qk(model: nn.Module, case: Case):
    """llama.cpp stores Llama's Q and K rows permuted for its interleaved RoPE; a GGUF import that
    forgets to undo it leaves them so."""
    c = model.config
    return _edit(*[(b.attn.q.weight, _permute(b.attn.q.weight, c.n_heads)) for b in _blocks(model)],
                 *[(b.attn.k.weight, _permute(b.attn.k.weight, c.n_kv_heads)) for b in _blocks(model)])


def interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE rotating adjacent pairs (x₀, x₁), (x₂, x₃)… — Meta's and llama.cpp's layout — on weights laid
    out for HF's rotate-half: the angles of pair j are those of HF's (j, j + hd/2)."""
    half = cos.shape[-1] // 2
    cos, sin = (t[..., :half].repeat_interleave(2, dim=-1) for t in (cos, sin))
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def _interleaved(model: nn.Module, case: Case):
    import importlib
    return _patch(importlib.import_module(type(_blocks(model)[0].attn).__module__), "rope", interleaved_rope)


def _rope_fields(model: nn.Module, **changes) -> Iterator[None]:
    """The RoPE fields ``changes`` (theta, scaling, local_theta): on the decoder's ``Rotary``, or on a config
    that holds them itself (Gemma's, ``rope_`` + the name)."""
    c = model.config
    if isinstance(c, DecoderConfig):
        return _config(model, rope=dataclasses.replace(c.rope, **changes))
    return _config(model, **{f"rope_{k}": v for k, v in changes.items()})


def _theta_10x(model: nn.Module, case: Case):
    c = model.config
    r = c.rope if isinstance(c, DecoderConfig) else None
    theta, local = (r.theta, r.local_theta) if r else (c.rope_theta, getattr(c, "rope_local_theta", None))
    return _rope_fields(model, theta=theta * 10, **({} if local is None else {"local_theta": local * 10}))


def _scaling_dropped(model: nn.Module, case: Case):
    return _rope_fields(model, scaling=None)


@contextlib.contextmanager
def _eps(model: nn.Module, case: Case) -> Iterator[None]:
    """1e-5 read as 1e-6 (or the other way): every norm's epsilon."""
    with contextlib.ExitStack() as stack:
        for norm in _norms(model):
            stack.enter_context(_set(norm, eps=1e-6 if norm.eps >= 1e-5 else 1e-5))
        yield


def _one_plus_w_as_w(model: nn.Module, case: Case):
    """Gemma's norms scale by (1 + w): read as a plain w, every scale is one less."""
    return _edit(*[(n.weight, n.weight - 1) for n in _norms(model)])


def _gelu_erf(model: nn.Module, case: Case):
    if case.arch == "gpt2":
        return _all(*[_set(b.mlp, approximate="none") for b in _blocks(model)])
    import torch.nn.functional as F
    import importlib
    return _patch(importlib.import_module(type(_blocks(model)[0].mlp).__module__), "geglu",
                  lambda x, gate, up, down: down(F.gelu(gate(x)) * up(x)))


@contextlib.contextmanager
def _all(*contexts) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        yield


def _mlps(model: nn.Module) -> list[nn.Module]:
    out = []
    for b in _blocks(model):
        out += list(b.mlp.experts) if hasattr(b.mlp, "experts") else [b.mlp]
    return out


def _gate_up_swapped(model: nn.Module, case: Case):
    return _edit(*[(m.gate.weight, m.up.weight) for m in _mlps(model)], *[(m.up.weight, m.gate.weight) for m in _mlps(model)])


def _head_zeros(model: nn.Module, case: Case):
    """A tied head written as a separate tensor of zeros (the converter made the head and never filled it)."""
    module = _model_module(model)
    linear, emb = module.linear, model.tok_emb.weight
    return _patch(module, "linear", lambda x, w: linear(x, torch.zeros_like(w)) if w is emb else linear(x, w))


def _layers_swapped(model: nn.Module, case: Case):
    a, b = _blocks(model)[:2]
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return _edit(*[(pa[n], pb[n]) for n in pa], *[(pb[n], pa[n]) for n in pa])


def _attentions_with_window(model: nn.Module) -> list[nn.Module]:
    return [b.attn for b in _blocks(model) if getattr(b.attn, "window", None)]


def _window_off_by_one(model: nn.Module, case: Case):
    return _all(*[_set(a, window=a.window + 1) for a in _attentions_with_window(model)])


def _softcap_dropped(model: nn.Module, case: Case):
    return _config(model, final_logit_softcapping=None)


def _scale_from_head_dim(model: nn.Module, case: Case):
    return _all(*[_set(b.attn, scale=b.attn.head_dim**-0.5) for b in _blocks(model)])


def _square_out(model: nn.Module) -> nn.Parameter | None:
    """The last layer's attention output projection, where it is square (so a transpose keeps its shape)."""
    attn = _blocks(model)[-1].attn
    w = (attn.proj if hasattr(attn, "proj") else attn.o).weight
    return w if w.shape[0] == w.shape[1] else None


def _transposed(model: nn.Module, case: Case):
    w = _square_out(model)
    return _edit((w, w.t()))


def _expert_swapped(model: nn.Module, case: Case):
    e0, e1 = _blocks(model)[0].mlp.experts[:2]
    p0, p1 = dict(e0.named_parameters()), dict(e1.named_parameters())
    return _edit(*[(p0[n], p1[n]) for n in p0], *[(p1[n], p0[n]) for n in p0])


def _bias_dropped(model: nn.Module, case: Case):
    """A bias the converter did not copy: Qwen2's q bias, GPT-2's MLP input bias, left at zero."""
    biases = [b.mlp.fc.bias if case.arch == "gpt2" else b.attn.q.bias for b in _blocks(model)]
    return _edit(*[(b, torch.zeros_like(b)) for b in biases])


def _rope(case: Case, model: nn.Module) -> bool:
    return case.arch != "gpt2"


def _last_layer(step: str) -> Callable[[Case, nn.Module], str]:
    return lambda case, model: _block_step(case, len(_blocks(model)) - 1, step)


BUGS: list[Bug] = [
    Bug("missing Q/K permutation", lambda case, m: case.arch == "llama" and case.family in ("llama", "mistral", "mixtral"),
        _unpermuted_qk, _first_step("post_attention_norm")),
    Bug("RoPE interleaved for rotate-half", _rope, _interleaved, _first_step("post_attention_norm")),
    Bug("RoPE theta off by 10×", _rope, _theta_10x, _first_step("post_attention_norm")),
    # Gemma 3 scales only its global layers' RoPE: the first of them is layer 5 in the fixture
    Bug("RoPE scaling dropped", lambda case, m: case.scaled, _scaling_dropped,
        lambda case, m: _block_step(case, m.config.layer_types.index("full_attention"), "post_attention_norm")
        if case.arch == "gemma3" else "block.0"),
    Bug("norm eps 1e-5 for 1e-6", lambda case, m: True, _eps, _first_step("q_norm")),
    Bug("(1 + w) norm read as w", lambda case, m: case.arch == "gemma3", _one_plus_w_as_w, _first_step("q_norm")),
    Bug("GELU erf for tanh", lambda case, m: case.arch in ("gpt2", "gemma3"), _gelu_erf,
        _first_step("post_feedforward_norm")),
    Bug("gate and up swapped", lambda case, m: case.arch != "gpt2", _gate_up_swapped, _first_step("post_feedforward_norm")),
    Bug("tied head untied to zeros", lambda case, m: case.tied, _head_zeros, lambda case, m: "logits"),
    Bug("layers 0 and 1 swapped", lambda case, m: True, _layers_swapped, _first_step("q_norm")),
    Bug("sliding window off by one", lambda case, m: case.window, _window_off_by_one,
        _first_step("post_attention_norm")),
    Bug("logit soft-capping dropped", lambda case, m: case.softcap, _softcap_dropped, lambda case, m: "logits"),
    Bug("attention scale from head_dim", lambda case, m: case.arch == "gemma3", _scale_from_head_dim,
        _first_step("post_attention_norm")),
    Bug("one square weight transposed", lambda case, m: _square_out(m) is not None, _transposed,
        _last_layer("post_attention_norm")),
    Bug("two experts' weights swapped", lambda case, m: case.experts, _expert_swapped, _first_step("q_norm")),
    Bug("a bias dropped", lambda case, m: case.biases, _bias_dropped, _first_step("q_norm")),
]
