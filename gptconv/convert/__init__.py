"""Converters: checkpoints in other people's layouts → our models (and back, for export).

- ``keymap``: the generic key-mapping engine and its ledger;
- ``gpt2``: GPT-2's HF config parser and key table;
- ``llama``: the same for the Llama family (llama, mistral, qwen2);
- ``checkpoint``: reading a local HF folder (safetensors, shards, .bin);
- ``hub``: fetching from the Hugging Face Hub.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .gpt2 import GPT2_HF, gpt2_config_from_hf, gpt2_config_to_hf
from .keymap import KeyMap, Plan, TensorInfo, model_shapes
from .llama import llama_config_from_hf, llama_config_to_hf, llama_hf_keymap


@dataclass(frozen=True)
class HFFamily:
    """What converting one HF ``model_type`` takes: its config parser, inverse, and key table
    (a function of our config, since a tied head changes what ``lm_head.weight`` is)."""

    config_from_hf: Callable[[dict[str, Any], object], Any]
    config_to_hf: Callable[[Any], dict[str, Any]]
    keymap: Callable[[Any], KeyMap]


_LLAMA = HFFamily(llama_config_from_hf, llama_config_to_hf, llama_hf_keymap)
HF_FAMILIES: dict[str, HFFamily] = {
    "gpt2": HFFamily(gpt2_config_from_hf, gpt2_config_to_hf, lambda config: GPT2_HF),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
}



def hf_family(config: Any) -> HFFamily:
    """The HF family that writes and reads ``config`` (our architecture name → an HF model_type)."""
    return HF_FAMILIES[{"gpt2": "gpt2", "llama": "llama"}[config.arch]]


__all__ = ["GPT2_HF", "HFFamily", "HF_FAMILIES", "KeyMap", "hf_family", "Plan", "TensorInfo", "model_shapes"]
