"""Converters: checkpoints in other people's layouts → our models (and back, for export).

- ``keymap``: the generic key-mapping engine and its ledger;
- ``gpt2``, ``llama``: one module per architecture, each with its config parsers (HF config.json,
  GGUF metadata) and its key tables for both formats, transforms included;
- ``hf_config``: typed reading of config.json; ``gguf_meta``: llama.cpp's tensor names;
- ``spm``, ``gguf_tokenizer``, ``hf_vocab``: tokenizer formats (SentencePiece, GGUF, an HF folder's
  tokenizer as llama.cpp's converter writes it).

Files are read in ``gptconv.sources``; this package says what they mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .gemma3 import GEMMA3_GGUF, GEMMA3_HF, gemma3_config_from_gguf, gemma3_config_from_hf, gemma3_config_to_hf
from .gpt2 import GPT2_GGUF, GPT2_HF, gpt2_config_from_gguf, gpt2_config_from_hf, gpt2_config_to_hf
from .keymap import KeyMap, Plan, TensorInfo, model_shapes
from .llama import (LLAMA_FAMILIES, llama_config_from_gguf, llama_config_from_hf, llama_config_to_hf, llama_gguf_keymap,
                    llama_hf_keymap, llama_model_type)


@dataclass(frozen=True)
class HFFamily:
    """What converting one HF ``model_type`` takes: its config parser, inverse, and key table
    (a function of our config, since a tied head changes what ``lm_head.weight`` is)."""

    config_from_hf: Callable[[dict[str, Any], object], Any]
    config_to_hf: Callable[[Any], dict[str, Any]]
    keymap: Callable[[Any], KeyMap]
    # the names transformers' model class holds in memory, where they differ from its files' (Mixtral)
    module_keymap: Callable[[Any], KeyMap] | None = None


_LLAMA = HFFamily(llama_config_from_hf, llama_config_to_hf, llama_hf_keymap,
                  lambda config: llama_hf_keymap(config, module=True))
HF_FAMILIES: dict[str, HFFamily] = {
    "gpt2": HFFamily(gpt2_config_from_hf, gpt2_config_to_hf, lambda config: GPT2_HF),
    **{model_type: _LLAMA for model_type in LLAMA_FAMILIES},
    # Gemma 3's text model; the multimodal wrapper (model_type gemma3) is not handled
    "gemma3_text": HFFamily(gemma3_config_from_hf, gemma3_config_to_hf, lambda config: GEMMA3_HF),
}



# GGUF general.architecture → (config from the file's metadata and tensors, key map for that config)
GGUF_ARCHS: dict[str, tuple[Callable[[Any, dict[str, TensorInfo]], Any], Callable[[Any], KeyMap]]] = {
    "llama": (llama_config_from_gguf, llama_gguf_keymap),
    **{arch: (llama_config_from_gguf, lambda config, arch=arch: llama_gguf_keymap(config, arch))
       for arch in ("qwen2", "qwen3", "phi3")},
    "gpt2": (gpt2_config_from_gguf, lambda config: GPT2_GGUF),
    "gemma3": (gemma3_config_from_gguf, lambda config: GEMMA3_GGUF),
}


def gguf_arch(config: Any) -> str:
    """The GGUF architecture llama.cpp's converter writes ``config`` as: ``qwen2``, ``qwen3`` and
    ``phi3`` (whose Q/K rows stay in HF's order) for those HF types; Llama, Mistral and Mixtral as
    ``llama``."""
    if config.arch == "llama":
        kind = llama_model_type(config)
        return kind if kind in ("qwen2", "qwen3", "phi3") else "llama"
    return config.arch


def hf_family(config: Any) -> HFFamily:
    """The HF family that writes and reads ``config`` (our architecture name → an HF model_type)."""
    if config.arch == "llama":
        return HF_FAMILIES[llama_model_type(config)]
    return HF_FAMILIES[{"gpt2": "gpt2", "gemma3": "gemma3_text"}[config.arch]]


__all__ = ["GGUF_ARCHS", "gguf_arch", "GPT2_HF", "HFFamily", "HF_FAMILIES", "KeyMap", "hf_family", "Plan", "TensorInfo", "model_shapes"]
