"""Our models: each family's model (``gptconv/families/``, one file each) built from the shared parts
(``gptconv/layers/``). ``build`` makes the model for any config of ours."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from ..families import PRESETS as _PRESETS
from ..families import family_of
from ..families.gpt2 import GPT2, GPT2Config
from ..layers.decoder import Decoder, DecoderConfig
from ..layers.kv_cache import KVCache
from ..layers.rope import RopeScaling

# preset name → its config (``gptconv.families.PRESETS`` has their Hub repos too)
PRESETS: dict[str, object] = {name: preset.config for name, preset in _PRESETS.items()}


def build(config: object) -> nn.Module:
    """The model for ``config``, randomly initialised as its modules do."""
    return family_of(config).build(config)


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


__all__ = ["GPT2", "GPT2Config", "KVCache", "Decoder", "DecoderConfig", "PRESETS", "RopeScaling", "build", "build_empty"]
