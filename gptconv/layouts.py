"""A checkpoint's weights as a state dict in the layout some model code loads: ours (``gptconv``), Hugging
Face's (transformers' model class for the family), or a user's own naming written as a key table.

Every layout goes through the key-map engine import and export use: the source's table maps it onto our
parameters (dequantized, Q/K un-permuted, Conv1D transposed — whatever the source format needs), and
the layout's table is read backwards (``KeyMap.inverse``) to name and reshape each tensor. A user's table
is written the way ours are — rows ``Map(their_name, our_name, transform)`` — and is checked whole
before any tensor is read: a row missing is an error naming the checkpoint's tensors it leaves out; a row
that fits no parameter of the model, a tensor given two names or a name given two tensors (a state dict
would keep the last, and a strict ``load_state_dict`` take it) is an error naming the rows.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .convert.keymap import KeyMap
from .errors import GptconvError
from .families import family_of
from .loader import load_source, open_source, parse_dtype
from .writers.tensors import Weights

LAYOUTS = ("gptconv", "hf")


def state_dict(source: str | Path, layout: str | KeyMap = "gptconv", dtype: str | torch.dtype = "float32",
               revision: str | None = None) -> dict[str, torch.Tensor]:
    """``source`` (any format gptconv reads) as a state dict for ``load_state_dict``: ``layout="gptconv"``
    for our model, ``"hf"`` for transformers' (tied heads under both names, as its state dict has them),
    or a ``KeyMap`` of the user's names onto ours."""
    dt = parse_dtype(dtype)
    if isinstance(layout, str) and layout not in LAYOUTS:
        raise GptconvError(f"layout '{layout}': choose {' or '.join(LAYOUTS)}, or give a KeyMap")
    if not isinstance(layout, (str, KeyMap)):  # its rows as a list, say: KeyMap(name, rows) checks them
        raise GptconvError(f"layout is a {type(layout).__name__}: choose {' or '.join(LAYOUTS)}, "
                           f"or give a KeyMap (KeyMap(name, rows) for a list of rows)")
    src = open_source(source, revision, backend="per-tensor")
    if layout == "gptconv":
        return load_source(src, dt).state_dict()
    if layout == "hf":  # the names transformers' model holds (Mixtral's experts fused, as transformers 5 has them)
        family = family_of(src.config)
        keymap = (family.hf_module_keymap or family.hf_keymap)(src.config)
    else:
        keymap = layout
    weights = Weights.of(src)
    tied = getattr(src.config, "tie_embeddings", True)  # GPT-2 and Gemma always tie their head
    if keymap is layout:  # a user's table: each of its rows fits this model, one name per tensor
        keymap.check_layout(weights.shapes, {"lm_head.weight"} if tied else set(), src.config)
    _check_complete(keymap, weights, src)
    stored = weights.stored_as(keymap)
    holds = {s.name: s.ours for s in stored}  # each name's tensors of ours
    copies: dict[str, str] = {}  # a tied copy's name → its original's
    for rule in keymap.rules:  # a tied copy (transformers' lm_head.weight) shares its original, when tied
        if (rule.kind == "tied" and "{" not in rule.source and rule.target in weights.shapes
                and (tied or rule.target != "tok_emb.weight")):
            if rule.source not in holds:
                holds[rule.source] = (rule.target,)
                copies[rule.source] = keymap.source_name(rule.target, src.config)[0]
            elif rule.target not in holds[rule.source]:  # the name is another tensor's: one would be lost
                theirs = " + ".join(f"'{n}'" for n in holds[rule.source])
                raise GptconvError(f"key map {keymap.name}: '{rule.source}' is given two targets, {theirs} and "
                                   f"'{rule.target}' (row {rule}): one name holds one tensor")
    out = {s.name: tensor.to(dt, copy=True) for s, tensor in zip(stored, weights.written(stored))}
    for name, original in copies.items():
        out[name] = out[original]
    return out


def _check_complete(keymap: KeyMap, weights: Weights, src) -> None:
    """Every one of our parameters has a row in ``keymap``; else one error naming, in the checkpoint's
    own names, the tensors the table leaves out (layers folded into ``{i}``)."""
    left: dict[str, str] = {}
    count = 0
    for target in weights.shapes:
        try:
            keymap.rule_for(target, src.config)
        except GptconvError:
            count += 1
            theirs = src.keymap.source_name(target, src.config)[0]
            left.setdefault(_pattern(theirs), _pattern(target))
    if left:
        listed = ", ".join(f"'{theirs}' (ours '{ours}')" for theirs, ours in list(left.items())[:6])
        more = f" and {len(left) - 6} more kinds" if len(left) > 6 else ""
        raise GptconvError(f"key map {keymap.name}: no row takes {count} of {src.name}'s tensors: {listed}{more}")


def _pattern(name: str) -> str:
    """A name with its layer number as {i} and an expert's as {j}: the rows a table writes."""
    numbers = iter(("{i}", "{j}", "{k}"))
    return re.sub(r"(?<=\.)\d+(?=\.)", lambda m: next(numbers, m.group()), name)
