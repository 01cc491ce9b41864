"""transformers' own reading of a checkpoint, a part at a time, into its model built on the meta device.

verify's reference must read the file as transformers reads it (never through our key map); and at 8B
its model cannot be held whole, in float64 and in our dtype, beside ours. So transformers' loading is
run on one part of the checkpoint at a time, the part whose block is about to run:

- an **HF folder**: transformers' loader itself (``convert_and_load_state_dict_in_model``, what
  ``from_pretrained`` calls) on the block's tensors, with its renamings and conversions (experts
  stored one by one, fused in its module; GPT-2's original names);
- a **GGUF file**: transformers' GGUF functions on each tensor (``modeling_gguf_pytorch_utils``: its
  name map from gguf-py's tables, the gguf dequantization it calls, its tensor processor: the Q/K
  permutation undone, Gemma's norms − 1, …), as its ``load_gguf_checkpoint`` does for a whole file.

A part is read once and given to every model that asks for it next (the float64 truth, then the
reference in our dtype: each casts it). The tables (embeddings, the LM head) are read by rows
(``gptconv.streaming.Rows``) where transformers moves them by name alone.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from ..errors import where
from ..streaming import RowReader, assign, tie_groups


class Reading:
    """A checkpoint as transformers reads it, by parts: ``parts`` maps a block's module name (None:
    outside the blocks) to the source tensors transformers loads into it; ``tables`` maps a parameter
    of transformers' model to the source tensor whose rows it reads."""

    path: Path
    parts: dict[str | None, list[str]]
    tables: dict[str, str]

    def __init__(self) -> None:
        self._last: tuple[str | None, dict[str, torch.Tensor]] | None = None

    def part(self, block: str | None) -> dict[str, torch.Tensor]:
        """The tensors of ``block`` as read (kept until another part is asked for)."""
        if self._last is None or self._last[0] != block:
            self._last = None
            self._last = (block, self._read(block))
        return self._last[1]

    def forget(self) -> None:
        self._last = None

    def _read(self, block: str | None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def fill(self, model: nn.Module, block: str | None, dtype: torch.dtype) -> None:
        raise NotImplementedError

    def rows(self, name: str, dtype: torch.dtype) -> RowReader:
        raise NotImplementedError


def block_of(name: str, blocks: list[str]) -> str | None:
    """The block (a module name) parameter ``name`` is in, if any."""
    return next((b for b in blocks if name.startswith(b + ".")), None)


def _quietly():
    """transformers' loaders draw progress bars and print notes of their own: not on our output."""
    return contextlib.redirect_stderr(io.StringIO())


class HFReading(Reading):
    """An HF folder read by transformers' loader (``convert_and_load_state_dict_in_model``) a block at
    a time. ``model`` (on meta) gives the names and the conversion rules transformers applies."""

    def __init__(self, src, model: nn.Module, blocks: list[str], tables: list[str]) -> None:
        super().__init__()
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        self.src, self.path = src, src.path
        self.mapping = get_model_conversion_mapping(model)
        renamings = [m for m in self.mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in self.mapping if isinstance(m, WeightConverter)]
        meta = model.state_dict()
        self.parts, self.tables = {}, {}
        self.covers: set[str] = set()
        for key in src.tensors:
            renamed, converted = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
            if renamed not in meta and key in meta:
                renamed, converted = key, None
            self.covers.add(renamed)
            if converted is None and renamed in tables:
                self.tables[renamed] = key
            else:
                self.parts.setdefault(block_of(renamed, blocks), []).append(key)

    def _read(self, block: str | None) -> dict[str, torch.Tensor]:
        return {key: self.src.tensors[key].load() for key in self.parts.get(block, [])}

    def fill(self, model: nn.Module, block: str | None, dtype: torch.dtype) -> None:
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        from transformers.modeling_utils import LoadStateDictConfig

        tensors = self.part(block)
        if not tensors:
            return
        config = LoadStateDictConfig(dtype=dtype, weight_mapping=self.mapping, dtype_plan=model._get_dtype_plan(dtype))
        saved = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
        os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"  # one tensor at a time, in this thread: no pool of readers
        try:
            with _quietly(), torch.no_grad():
                info, _ = convert_and_load_state_dict_in_model(model, dict(tensors), config)
        finally:
            if saved is None:
                os.environ.pop("HF_DEACTIVATE_ASYNC_LOAD", None)
            else:
                os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = saved
        if info.mismatched_keys:
            name, got, want = sorted(info.mismatched_keys)[0]
            raise where(self.path, f"transformers reads a tensor of shape {tuple(got)} for its '{name}', which is "
                                   f"{tuple(want)}")
        if info.conversion_errors:
            name, error = next(iter(info.conversion_errors.items()))
            raise where(self.path, f"transformers cannot convert the tensors of its '{name}' ({str(error)[:200]})")

    def rows(self, name: str, dtype: torch.dtype) -> RowReader:
        info = self.src.tensors[self.tables[name]]
        return lambda index: info.read_rows(index).to(dtype, memory_format=torch.contiguous_format)


class GGUFReading(Reading):
    """A GGUF file read by transformers' GGUF functions, tensor by tensor, as its
    ``load_gguf_checkpoint`` reads a whole file: gguf's ``dequantize`` (which it imports), its
    ``TENSOR_PROCESSORS[architecture]`` (configured with its own reading of the file's metadata) and
    its ``get_gguf_hf_weights_map`` name map. ``model_type``: the type transformers reads this file
    as, where not the model's own (``Family.transformers_reads_gguf_as``)."""

    def __init__(self, src, model: nn.Module, blocks: list[str], tables: list[str],
                 model_type: str | None = None) -> None:
        super().__init__()
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        self.src, self.path, self.gguf = src, src.path, src.gguf
        from gguf import dequantize  # what load_gguf_checkpoint calls (it imports it from gguf)
        self.dequantize = dequantize
        with _quietly():
            self.read_config = gguf_utils.load_gguf_checkpoint(str(src.path), return_tensors=False)["config"]
        arch = src.gguf.fields.arch
        self.processor = gguf_utils.TENSOR_PROCESSORS.get(arch, gguf_utils.TensorProcessor)(config=self.read_config)
        self.names = gguf_utils.get_gguf_hf_weights_map(model, self.processor, model_type)  # GGUF → transformers
        self.parts, self.tables = {}, {}
        self.covers = set()
        for key in src.tensors:
            hf_name = self.names.get(key)
            if hf_name is None:  # transformers skips what its map does not name (rope_freqs: its config's business)
                continue
            self.covers.add(hf_name)
            if hf_name in tables:
                self.tables[hf_name] = key
            else:
                self.parts.setdefault(block_of(hf_name, blocks), []).append(key)

    def _process(self, key: str, weights: np.ndarray, local: dict) -> None:
        """One GGUF tensor through transformers' processor, into ``local["tensors"]`` (transformers'
        names): as its loader's loop does, one dict for the tensors processed together (a processor
        joins the gate and up experts into one tensor there)."""
        result = self.processor.process(weights=weights, name=key, tensor_key_mapping=self.names,
                                        parsed_parameters=local)
        if result.name in self.names:
            local["tensors"][self.names[result.name]] = torch.from_numpy(np.copy(result.weights))

    def _weights(self, key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        data, kind = self.gguf.raw(key, start, stop)
        with np.errstate(all="ignore"):
            return self.dequantize(data, kind)

    def _read(self, block: str | None) -> dict[str, torch.Tensor]:
        local: dict = {"tensors": {}}
        for key in self.parts.get(block, []):
            self._process(key, self._weights(key), local)
        return local["tensors"]

    def fill(self, model: nn.Module, block: str | None, dtype: torch.dtype) -> None:
        groups = {n: g for g in tie_groups(model).values() for n in g}
        buffers = dict(model.named_buffers())
        for name, tensor in self.part(block).items():
            if name in buffers:
                with torch.no_grad():
                    buffers[name].copy_(tensor.to(buffers[name].dtype))
                continue
            if name not in groups:
                raise where(self.path, f"transformers' GGUF reader gives '{name}', which its model does not have")
            want = tuple(model.get_parameter(name).shape)
            if tuple(tensor.shape) != want:
                raise where(self.path, f"transformers' GGUF reader gives '{name}' the shape {tuple(tensor.shape)}; its "
                                       f"model's is {want}")
            assign(model, groups[name], tensor.to(dtype))  # its layout kept, as its loader keeps it (a transpose)

    def rows(self, name: str, dtype: torch.dtype) -> RowReader:
        key = self.tables[name]

        def read(index: slice | torch.Tensor) -> torch.Tensor:
            if isinstance(index, slice):
                runs = [(index.start, index.stop)]
            else:
                runs = []
                for i in index.tolist():
                    if runs and runs[-1][1] == i:
                        runs[-1] = (runs[-1][0], i + 1)
                    else:
                        runs.append((i, i + 1))
            parts = []
            for start, stop in runs:
                local: dict = {"tensors": {}}
                self._process(key, self._weights(key, start, stop), local)
                got = local["tensors"]
                if list(got) != [name]:
                    raise where(self.path, f"transformers' GGUF reader does not give '{key}' as '{name}' row by row")
                parts.append(got[name])
            return (torch.cat(parts) if len(parts) > 1 else parts[0]).to(dtype, memory_format=torch.contiguous_format)
        return read


def missing(model: nn.Module, covers: set[str]) -> list[str]:
    """What transformers' loading must fill and no source tensor does: its parameters (by tie group) and
    the buffers it saves (Gemma 4's layer scalars), as ``from_pretrained``'s missing keys."""
    params = {n for names in tie_groups(model).values() for n in names}
    buffers = [n for n in model.state_dict() if n not in params and n not in covers]
    return sorted([names[0] for names in tie_groups(model).values() if not covers & set(names)] + buffers)


Fill = Callable[[str | None], None]
