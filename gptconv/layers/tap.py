"""A tap sees each named step of the forward pass: ``tap("block.3", x)``.

The trace, verify and the parity tests use it to read the activations the model computes;
the default tap does nothing, so a plain forward pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tap = Callable[[str, torch.Tensor], None]


def no_tap(name: str, x: torch.Tensor) -> None:
    pass
