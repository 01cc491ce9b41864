"""Our model → a Hugging Face folder that transformers' ``from_pretrained`` loads.

Names and transforms come from the same key table as import (``KeyMap.source_name``), so export
cannot drift from import. Tied weights are stored once, as transformers stores them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch

from ..errors import where
from ..families import family_of
from ..output import WriteBehind, sha256_file
from ..sources.files import regular_file
from ..sources.hf_folder import read_json
from .safetensors_file import SafetensorsWriter
from .tensors import ExportedFile, Narrowing, Stored, Weights

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json")
WRITTEN = ("config.json", "generation_config.json", "model.safetensors.index.json", *TOKENIZER_FILES)
SHARD = re.compile(r"model(-\d{5,}-of-\d{5,})?\.safetensors")  # as named below


def written_by_export(name: str) -> bool:
    """Whether an export writes a file of this name into its folder: all that --force may delete there."""
    return name in WRITTEN or SHARD.fullmatch(name) is not None


def write_hf_folder(weights: Weights, src, tokenizer, folder: Path, dtype: torch.dtype, shard_bytes: int,
                    narrow: Narrowing) -> list[ExportedFile]:
    cfg = weights.config
    family = family_of(cfg)
    try:
        config_json = family.config_to_hf(cfg)
    except ValueError as e:
        raise where(src.path, f"cannot be written in HF layout: {e}") from None
    keymap = family.hf_keymap(cfg)
    folder.mkdir()

    stored = weights.stored_as(keymap)  # then shards of at most shard_bytes
    shards: list[list[Stored]] = [[]]
    size = 0
    for s in stored:
        nbytes = torch.Size(s.shape).numel() * dtype.itemsize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += nbytes

    tensors = weights.written(stored)
    files, weight_map = [], {}
    for n, shard in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        with SafetensorsWriter(folder / file, [(s.name, dtype, s.shape) for s in shard], {"format": "pt"}) as writer:
            with WriteBehind() as write:
                for s, tensor in zip(shard, tensors):  # the shard's row first: zip stops before reading past it
                    data = narrow(s.name, tensor, dtype)
                    del tensor
                    write(writer.write, s.name, data)
                    weight_map[s.name] = file
            digest = writer.close()
            files.append(ExportedFile(file, (folder / file).stat().st_size, digest))
    if len(shards) > 1:
        total = sum(torch.Size(s.shape).numel() * dtype.itemsize for s in stored)
        files.append(_write_json(folder / "model.safetensors.index.json",
                                 {"metadata": {"total_size": total}, "weight_map": weight_map}))
    config_json["dtype"] = str(dtype).removeprefix("torch.")
    files.append(_write_json(folder / "config.json", config_json))
    generation = {k: getattr(cfg, k) for k in ("bos_token_id", "eos_token_id") if getattr(cfg, k) is not None}
    if generation:
        files.append(_write_json(folder / "generation_config.json", generation))
    files += _write_tokenizer(src, tokenizer, folder)
    return files


def _write_tokenizer(src, tokenizer, folder: Path) -> list[ExportedFile]:
    if src.format == "hf":  # the checkpoint's own files, byte for byte
        names = [n for n in TOKENIZER_FILES if os.path.lexists(src.path / n)]
        for n in names:
            regular_file(src.path / n)  # a FIFO, a device or a link out of the folder is refused, not skipped
            if n.endswith(".json"):
                read_json(src.path / n)  # copied only if it is JSON
        for n in names:
            shutil.copyfile(src.path / n, folder / n)
        return [_describe(folder / n) for n in names]
    if tokenizer is None:
        return []
    tokenizer.tk.save(str(folder / "tokenizer.json"))
    token = lambda i: tokenizer.token(i) if i is not None else None  # noqa: E731
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "bos_token": token(tokenizer.bos_id), "eos_token": token(tokenizer.eos_id),
              "unk_token": token(tokenizer.unk_id), "pad_token": token(tokenizer.pad_id)}
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    return [_describe(folder / "tokenizer.json"), _write_json(folder / "tokenizer_config.json", config)]


def _write_json(path: Path, obj: object) -> ExportedFile:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return _describe(path)


def _describe(path: Path) -> ExportedFile:
    return ExportedFile(path.name, path.stat().st_size, sha256_file(path))
