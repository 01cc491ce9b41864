"""The multi-token-prediction (MTP) layers some checkpoints ship (Qwen3.5/3.6, Qwen3-Next): a draft head
for speculative decoding, which guesses the token after next from the trunk's last hidden state h and the
next token's embedding e:

    x = fc(concat(enorm(e), hnorm(h)))      # (B, T, 2d) → (B, T, d)
    x = layers(x)                           # full-attention blocks of the trunk's own kind (MoE where it is)
    logits = lm_head(norm(x))               # the trunk's head

The next-token trace never runs them, and gptconv does not either: they are held so that a checkpoint's
every tensor has a place (the strict ledger), and so that export writes them back (HF ``mtp.*``; GGUF
``blk.{n_layers + j}.*`` with the ``nextn`` tensors, as llama.cpp's converter does, whose llama.cpp
runs them as a draft model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch.nn as nn

from .linear import Linear

HELD = "mtp."  # our names of the parameters held, not run


def full_attention(config: Any) -> Any:
    """The trunk's config as one full-attention layer of it: no linear or conv layers, every layer alike."""
    return replace(config, layer_types=(), linear_attention=None, short_conv=None, moe_layers=(),
                   rope=replace(config.rope, layers=()), mtp_layers=0)


class MTP(nn.Module):
    """Held, not run (see the module's docstring): ``fc``, ``enorm``, ``hnorm``, ``norm`` and ``layers``."""

    def __init__(self, config: Any, block: Callable[[Any], nn.Module]) -> None:
        super().__init__()
        d = config.d_model
        self.fc = Linear(2 * d, d, bias=False)  # over [enorm(e), hnorm(h)]
        self.enorm = config.norm(d)
        self.hnorm = config.norm(d)
        self.layers = nn.ModuleList(block(full_attention(config)) for _ in range(config.mtp_layers))
        self.norm = config.norm(d)
