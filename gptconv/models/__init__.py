"""Our model code: one file per architecture, each a config dataclass, presets and the module."""

from __future__ import annotations

import torch.nn as nn

from .gpt2 import GPT2, GPT2Config
from .gpt2 import PRESETS as GPT2_PRESETS
from .kv_cache import KVCache
from .llama import PRESETS as LLAMA_PRESETS
from .llama import Llama, LlamaConfig
from .rope import RopeScaling

# architecture name → (config class, model class)
ARCHITECTURES: dict[str, tuple[type, type[nn.Module]]] = {
    "gpt2": (GPT2Config, GPT2),
    "llama": (LlamaConfig, Llama),
}

PRESETS: dict[str, object] = {**GPT2_PRESETS, **LLAMA_PRESETS}


def build(config: object) -> nn.Module:
    """The model for ``config``; build it under ``torch.device("meta")`` to allocate nothing."""
    return ARCHITECTURES[config.arch][1](config)


__all__ = ["ARCHITECTURES", "GPT2", "GPT2Config", "KVCache", "Llama", "LlamaConfig", "PRESETS", "RopeScaling",
           "build"]
