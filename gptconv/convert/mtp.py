"""The names of the multi-token-prediction layers (``layers/mtp.py``) in each format, read off the trunk's
own layer rows: an MTP layer is a full-attention layer of the trunk, under other names.

- Hugging Face (Qwen3.5/3.6, Qwen3-Next): ``mtp.layers.{i}.*`` as the trunk's ``model.layers.{i}.*``, and
  ``mtp.fc`` (``[e; h]`` → d), ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.norm``. Some
  files put them under ``model.mtp.``; both are read, ``mtp.`` is written.
- GGUF (llama.cpp's converter): MTP layer j is block ``n_layers + j`` (``blk.{n_layers + j}.*``, the trunk's
  names, its norms + 1 as the trunk's), and the four tensors outside the layers sit in the first of them:
  ``blk.{n}.nextn.eh_proj``, ``enorm``, ``hnorm`` and ``shared_head_norm``. Those rows name their block
  outright; where a trunk row's ``blk.{i}`` also fits the name, the outright row is the one that applies
  (``KeyMap.match``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gguf import MODEL_TENSOR as T

from .gguf_meta import gguf_name
from .keymap import IDENTITY, Map, Rule, Transform

if TYPE_CHECKING:
    from ..sources.gguf_file import GGUFFields

HF_PREFIXES = ("mtp.", "model.mtp.")  # the first is what export writes
# the tensors outside the MTP layers: HF's name → ours, and the GGUF tensor that holds it
_OUTSIDE = (("fc.weight", "mtp.fc.weight", T.NEXTN_EH_PROJ), ("pre_fc_norm_embedding.weight", "mtp.enorm.weight",
                                                               T.NEXTN_ENORM),
            ("pre_fc_norm_hidden.weight", "mtp.hnorm.weight", T.NEXTN_HNORM),
            ("norm.weight", "mtp.norm.weight", T.NEXTN_SHARED_HEAD_NORM))


def moved(rule: Rule, source: Callable[[str], str], target: Callable[[str], str]) -> Rule:
    """``rule`` under other names: its source renamed by ``source``, each of its targets by ``target``."""
    if rule.kind == "fused":
        return Rule(source(rule.source), kind="fused", fuse=rule.fuse,
                    parts=lambda ctx: [target(t) for t in rule.parts(ctx)])
    return Rule(source(rule.source), None if rule.target is None else target(rule.target), rule.transform, rule.kind)


def _layer_rows(rows: list[Rule]) -> list[Rule]:
    """The rows of the trunk's layers that fill a parameter (a Drop or Tied row names no MTP tensor)."""
    return [r for r in rows if r.kind in ("map", "fused") and r.source.startswith(("model.layers.{i}.", "blk.{i}."))]


def mtp_hf_rows(layer_rows: list[Rule]) -> list[Rule]:
    """The HF rows of the MTP layers: each trunk layer row under ``mtp.layers.{i}`` (and ``model.mtp``)."""
    rows = []
    for prefix in HF_PREFIXES:
        rows += [Map(f"{prefix}{hf}", ours) for hf, ours, _ in _OUTSIDE]
        rows += [moved(r, lambda s, p=prefix: s.replace("model.layers.{i}.", f"{p}layers.{{i}}.", 1),
                       lambda t: t.replace("blocks.{i}.", "mtp.layers.{i}.", 1)) for r in _layer_rows(layer_rows)]
    return rows


def mtp_gguf_rows(n_layers: int, mtp_layers: int, layer_rows: list[Rule], norm: Transform = IDENTITY) -> list[Rule]:
    """The GGUF rows of ``mtp_layers`` MTP layers after ``n_layers`` trunk layers; ``norm``: the transform
    of the trunk's norms (llama.cpp's qwen35 stores 1 + w), which the nextn norms get too."""
    rows = [Map(gguf_name(tensor).replace("{i}", str(n_layers)), ours, IDENTITY if tensor is T.NEXTN_EH_PROJ else norm)
            for _, ours, tensor in _OUTSIDE] if mtp_layers else []
    for j in range(mtp_layers):
        rows += [moved(r, lambda s: s.replace("{i}", str(n_layers + j), 1),
                       lambda t, j=j: t.replace("blocks.{i}.", f"mtp.layers.{j}.", 1)) for r in _layer_rows(layer_rows)]
    return rows


def with_hf_mtp_layers(config: Any, names: Collection[str]) -> Any:
    """``config`` with as many MTP layers as the file holds (``mtp.layers.{j}``): counted from its tensors,
    not config.json, whose ``mtp_num_hidden_layers`` a transformers save keeps while dropping the layers."""
    found = {int(m.group(1)) for n in names if (m := _HF_LAYER.match(n))}
    return replace(config, mtp_layers=max(found) + 1) if found else config


_HF_LAYER = re.compile(r"(?:model\.)?mtp\.layers\.(\d+)\.")


# DeepSeek's and GLM's MTP layers sit after the trunk's, as model.layers.{n + j} (llama.cpp: blk.{n + j}), a full
# layer of the trunk's kind plus these tensors of their own (HF name, llama.cpp's)
_DEEPSEEK_OUTSIDE = (("embed_tokens.weight", T.NEXTN_EMBED_TOKENS), ("enorm.weight", T.NEXTN_ENORM),
                     ("hnorm.weight", T.NEXTN_HNORM), ("eh_proj.weight", T.NEXTN_EH_PROJ),
                     ("shared_head.norm.weight", T.NEXTN_SHARED_HEAD_NORM),
                     ("shared_head.head.weight", T.NEXTN_SHARED_HEAD_HEAD))
MAX_DROPPED_MTP = 4  # MTP layers a file may hold after the trunk (the releases: 1)


def dropped_mtp_rows(layer_rows: list[Rule], n_layers: int, gguf: bool = False) -> list[Rule]:
    """Drop rows for the multi-token-prediction layers DeepSeek-V3, Kimi K2 and GLM files hold after the trunk's
    ``n_layers`` (``model.layers.{n + j}``; GGUF ``blk.{n + j}``, with its ``nextn.*``): dropped by name, as
    transformers drops them (they are not run, and not written back)."""
    from .keymap import Drop
    trunk = "blk.{i}." if gguf else "model.layers.{i}."
    rows = []
    for j in range(MAX_DROPPED_MTP):
        layer = f"blk.{n_layers + j}." if gguf else f"model.layers.{n_layers + j}."
        rows += [Drop(r.source.replace(trunk, layer, 1)) for r in _layer_rows(layer_rows) if r.source.startswith(trunk)]
        rows += [Drop(gguf_name(t).replace("{i}", str(n_layers + j)) if gguf else layer + hf) for hf, t in _DEEPSEEK_OUTSIDE]
    return rows


def with_dropped_mtp(keymap: Any, n_layers: int, gguf: bool = False) -> Any:
    """``keymap`` with the rows that drop the MTP layers after its ``n_layers`` (``dropped_mtp_rows``)."""
    from .keymap import KeyMap
    return KeyMap(keymap.name, list(keymap.rules) + dropped_mtp_rows(list(keymap.rules), n_layers, gguf))


def trunk_layers(f: GGUFFields, tensors: dict) -> int:
    """A GGUF's trunk layers: its block count less the MTP blocks after them (nextn_predict_layers), the
    count checked against the blocks its tensors hold before a per-layer list is made of it."""
    from gguf import Keys
    from .gguf_meta import block_count
    return block_count(f, tensors, less=f.get(Keys.LLM.NEXTN_PREDICT_LAYERS, int, 0))
