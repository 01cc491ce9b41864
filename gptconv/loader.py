"""Where a model comes from, and ``load``: source → checked key map → our nn.Module.

A source is a local HF folder, a GGUF file, an HF repo id, or an alias (``gpt2``). Models are built on
the meta device and filled tensor by tensor from the memory-mapped checkpoint, so weights are
never held twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from . import memory
from .convert import KeyMap, Plan, TensorInfo, model_shapes
from .streaming import Streamed, assign, table_names, tie_groups
from .families import BY_WRAPPER, for_gguf, for_hf
from .sources.hf_folder import open_hf_folder
from .sources.gguf_file import GGUFFile, open_gguf
from .sources.hub import fetch, repo_id_for
from .devices import parse_device
from .layers.mtp import HELD
from .errors import GptconvError, where
from .sources.files import SIDE_FILES, UNLIMITED, regular_file
from .models import build_empty
from .layers.config_checks import MAX_LAYERS

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
          "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise GptconvError(f"dtype '{dtype}': choose one of float32, float16, bfloat16")
    return DTYPES[dtype]


@dataclass
class Source:
    """An opened checkpoint: where it is, its config in our terms, and its tensors (not yet read)."""

    name: str  # what the user asked for
    path: Path  # the HF folder, or the .gguf file
    repo_id: str | None
    format: str  # "hf" or "gguf"
    config: Any  # our config dataclass
    keymap: KeyMap
    tensors: dict[str, TensorInfo]
    files: list[Path]
    stored_types: dict[str, str]  # tensor name → dtype as stored (float32, Q4_1, …)
    hf_config: dict[str, Any] | None = None
    gguf: GGUFFile | None = None
    layout: str = ""  # which key layout the tensors came in, set by the strict load
    dropped: list[str] = field(default_factory=list)  # tensors the key map drops by a named rule, set by it too
    held: list[str] = field(default_factory=list)  # tensors held, not run (MTP layers), set by it too
    # a multimodal checkpoint's text model: the wrapper's model_type, and the tensors left out of the
    # text model by the wrapper's rule (the vision tower, the projector), by their names in the file
    wrapper: str | None = None
    left_out: list[str] = field(default_factory=list)

    @property
    def arch(self) -> str:
        return self.config.arch

    def read_from(self) -> tuple[Path, ...]:
        """Its folder (or file) and every file it is read from, its weights and its side files: what an
        output's ``--force`` never replaces nor holds (``output.check_output``'s ``keep``)."""
        sides = [self.path / n for n in SIDE_FILES if os.path.lexists(self.path / n)] if self.path.is_dir() else []
        return (self.path, *map(Path, self.files), *sides)

    def plan(self, shapes: dict[str, tuple[int, ...]]) -> Plan:
        """The checked mapping of this checkpoint onto a model with these parameter shapes."""
        return self.keymap.plan(self.tensors, shapes, self.config, origin=self.path)


def resolve(source: str | Path, revision: str | None = None, prefer_cache: bool = True) -> tuple[Path, str | None]:
    """A local path as it is; an alias or repo id through the HF cache / Hub."""
    path = Path(source).expanduser()
    if path.exists():
        return path, None
    repo_id = repo_id_for(str(source))
    if repo_id is None:
        raise GptconvError(f"{source}: no such file or folder, and not a known alias or Hub repo id (owner/name)")
    return fetch(repo_id, revision, prefer_cache=prefer_cache), repo_id


def open_source(source: str | Path, revision: str | None = None, prefer_cache: bool = True,
                backend: str = "mmap") -> Source:
    """The checkpoint, its config and its tensors, none read yet; ``backend``: see ``open_hf_folder``."""
    path, repo_id = resolve(source, revision, prefer_cache)
    if not path.is_dir():
        regular_file(path, UNLIMITED)  # a FIFO or a device is named as such, before anything opens it
    if path.is_file():
        if path.suffix != ".gguf":
            raise GptconvError(f"{path}: a single file loads only as .gguf; for HF weights give the folder "
                               "with config.json")
        g = open_gguf(path)
        family = for_gguf(g.fields)
        try:
            config = family.config_from_gguf(g.fields, g.tensors)
        except ValueError as e:  # a part's shape or the config refusing what the file says (the HF path's checks)
            raise where(path, str(e)) from None
        return Source(str(source), path, repo_id, "gguf", config, family.gguf_keymap(config), g.tensors, [path],
                      g.stored_types, gguf=g)
    ckpt = open_hf_folder(path, backend)
    if ckpt.model_type in BY_WRAPPER:
        return _text_model_of(str(source), path, repo_id, ckpt)
    family = for_hf(ckpt.model_type, path / "config.json")
    config = family.config_from_hf_tensors(hf_config(family, ckpt.config, path / "config.json", ckpt.tensors),
                                           ckpt.tensors)
    stored = {k: t.stored or str(t.dtype).removeprefix("torch.") for k, t in ckpt.tensors.items()}
    return Source(str(source), path, repo_id, "hf", config, family.hf_keymap(config), ckpt.tensors,
                  ckpt.weight_files, stored, hf_config=ckpt.config)


LAYER_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")


def hf_config(family, data: dict, origin: object, tensors: dict) -> Any:
    """``family.config_from_hf``, its layer count first bounded (a config's count drives per-layer lists
    before its own checks run; a count within the bound that the tensors lack, the key map reports), a
    part's refusal naming the file."""
    for name in LAYER_COUNTS:
        n = data.get(name)
        if isinstance(n, int) and not isinstance(n, bool) and n > MAX_LAYERS:
            raise GptconvError(f"{origin}: field '{name}': n_layers = {n} is not an integer in 1 … {MAX_LAYERS:,}")
    try:
        return family.config_from_hf(data, origin)
    except ValueError as e:  # a part's own config (MLA's, RoPE scaling's) refusing what the file says
        raise GptconvError(f"{origin}: {e}") from None


def _text_model_of(name: str, path: Path, repo_id: str | None, ckpt) -> Source:
    """The text model inside a multimodal checkpoint: its ``text_config``, its tensors under the text
    model's names, and the tensors the wrapper's rule leaves out (listed, never silently dropped); a
    tensor that is neither is kept under its own name, so that the strict ledger names it."""
    origin = path / "config.json"
    family, wrapper = BY_WRAPPER[ckpt.model_type]
    text = ckpt.config.get("text_config")
    if not isinstance(text, dict):
        raise GptconvError(f"{origin}: a '{wrapper.model_type}' checkpoint without a text_config object "
                           "(the text model's config)")
    if text.get("model_type") not in wrapper.text_types:
        raise GptconvError(f"{origin}: text_config's model_type {text.get('model_type')!r} is not supported in a "
                           f"'{wrapper.model_type}' checkpoint (supported: {', '.join(wrapper.text_types)})")
    text = dict(text)
    if isinstance(ckpt.config.get("tie_word_embeddings"), bool):  # the wrapper's says whether its head is tied
        text["tie_word_embeddings"] = ckpt.config["tie_word_embeddings"]
    config = hf_config(family, text, f"{origin} (text_config)", ckpt.tensors)
    tensors, left_out = {}, []
    for key, info in ckpt.tensors.items():
        if wrapper.leaves_out(key):
            left_out.append(key)
            continue
        renamed = wrapper.text_name(key) or key
        if renamed in tensors:
            raise GptconvError(f"{path}: '{key}' and another tensor are both the text model's '{renamed}'")
        tensors[renamed] = info
    if not any(k.startswith("model.") for k in tensors):
        under = " or ".join(p for p, _ in wrapper.text_prefixes)
        raise GptconvError(f"{path}: no tensor of the text model under {under}")
    config = family.config_from_hf_tensors(config, tensors)
    stored = {k: t.stored or str(t.dtype).removeprefix("torch.") for k, t in tensors.items()}
    return Source(name, path, repo_id, "hf", config, family.hf_keymap(config), tensors, ckpt.weight_files, stored,
                  hf_config=text, wrapper=wrapper.model_type, left_out=left_out)


def load_source(src: Source, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu",
                blockwise: bool = False, solo: bool = True) -> nn.Module:
    """Our model for an opened source. ``blockwise``: streamed (``gptconv.streaming``): each block's
    weights read just before it runs and given back after it (``solo``; otherwise when the caller
    says, ``model.streamed.empty``), the tables (embedding, head) read by rows, never whole."""
    dtype = parse_dtype(dtype)
    device = parse_device(device)
    model = build_empty(src.config)
    plan = src.plan(model_shapes(model))
    src.layout, src.dropped = plan.layout, list(plan.dropped)
    src.held = list(dict.fromkeys(key for key, target, _ in plan.moves if target.startswith(HELD)))
    if blockwise:
        if device.type != "cpu":
            raise GptconvError(f"{src.name}: a model run one block at a time runs on the CPU, not {device}")
        model.streamed = stream_ours(model, plan, src.config.n_layers, dtype, solo)
    else:  # each tensor to the device as it is read: no CPU copy of the model (on the CPU, the mapped file)
        if device.type == "cpu":
            dt = str(dtype).removeprefix("torch.")
            memory.check(memory.model_need(f"loading {src.name} ({dt})", memory.Shape.of(src.config), dtype),
                         [("--dtype bf16", lambda: memory.model_need("", memory.Shape.of(src.config), torch.bfloat16))]
                         if dtype == torch.float32 else [])
        model.load_state_dict({name: t.to(device) for name, t in plan.tensors(dtype)}, strict=True, assign=True)
        model = model.to(device)
    model.source = src
    return model.eval()


def stream_ours(model: nn.Module, plan: Plan, n_layers: int, dtype: torch.dtype, solo: bool = True) -> Streamed:
    """Our model (on meta) streamed from ``plan``: blocks filled as they run, tables read by rows (an
    MTP draft head, held and never run, is never read)."""
    blocks = [f"blocks.{i}" for i in range(n_layers)] + (["mtp"] if getattr(model, "mtp", None) is not None else [])

    inside = tuple(f"{b}." for b in blocks)
    tables = {name: reader for name in table_names(model, "lm_head.weight")
              if (reader := plan.row_reader(name, dtype)) is not None}

    def fill(block: str | None) -> None:
        """A block's parameters, or (None) every one outside the blocks and the tables."""
        module = model if block is None else model.get_submodule(block)
        prefix = "" if block is None else f"{block}."
        for first, group in tie_groups(module).items():
            names = [prefix + n for n in group]
            if block is None and (names[0].startswith(inside) or any(n in tables for n in names)):
                continue
            assign(model, names, plan.tensor(names[0], dtype))
        plan.forget()
    return Streamed(model, blocks, fill, tables, dtype, solo)


def load(source: str | Path, dtype: str | torch.dtype = torch.float32, revision: str | None = None,
         device: str | torch.device = "cpu") -> nn.Module:
    """Our model for ``source``, weights checked and filled, in eval mode, with ``.config``.

    >>> model = gptconv.load("gpt2")            # alias, HF repo id, or a local folder
    >>> logits = model(torch.tensor([[464, 3139]]))  # (B, T, V)
    """
    return load_source(open_source(source, revision), dtype, device)
