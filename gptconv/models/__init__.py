"""Our model code: one file per architecture, each a config dataclass, presets and the module."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from .gemma3 import PRESETS as GEMMA3_PRESETS
from .gemma3 import Gemma3, Gemma3Config
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
    "gemma3": (Gemma3Config, Gemma3),
}

PRESETS: dict[str, object] = {**GPT2_PRESETS, **LLAMA_PRESETS, **GEMMA3_PRESETS}


def build(config: object) -> nn.Module:
    """The model for ``config``, randomly initialised as its modules do."""
    return ARCHITECTURES[config.arch][1](config)


def build_empty(config: object) -> nn.Module:
    """The model for ``config`` on the meta device, nothing allocated and nothing initialised: a
    checkpoint is about to fill every parameter. (Initialising on meta is not free: torch's
    ``normal_`` on a meta tensor imports torch._dynamo, 1.3 s, the first time.)"""
    with torch.device("meta"), _SkipInit():
        return build(config)


class _SkipInit(TorchFunctionMode):
    """Turns the ``torch.nn.init`` functions (which honour torch-function modes) into no-ops."""

    INIT = {getattr(torch.nn.init, n) for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.INIT:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


__all__ = ["ARCHITECTURES", "Gemma3", "Gemma3Config", "GPT2", "GPT2Config", "KVCache", "Llama", "LlamaConfig", "PRESETS", "RopeScaling",
           "build", "build_empty"]
