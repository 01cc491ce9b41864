"""A gated short convolution (LFM2's conv layers): a layer that mixes positions through a depthwise causal
convolution over its last few inputs, with input-dependent gates before and after it.

One projection gives three d-vectors per token, B, C and x; then

    y = out(C ⊙ conv(B ⊙ x))

where ``conv`` is a depthwise causal convolution of ``kernel`` taps (``layers/conv.py``). Each position
sees only its last ``kernel`` positions, so its cache slot holds the last kernel − 1 values of B ⊙ x and
nothing else: a ``RecurrentState`` without a recurrent part, the same size at any length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from .config_checks import check_sizes
from .conv import CausalConv
from .kv_cache import RecurrentState
from .linear import Linear


@dataclass(frozen=True)
class ShortConvShape:
    """A gated short convolution's options (HF: conv_L_cache, conv_bias). ``bias``: on the input and output
    projections and on the convolution alike (transformers' LFM2 has one flag for the three)."""

    kernel: int = 3
    bias: bool = False

    def __post_init__(self) -> None:
        check_sizes(self, {"kernel": 64})
        if self.kernel < 2:
            raise ValueError(f"short convolution: kernel = {self.kernel}; at least 2 taps (one past position)")


class ShortConv(nn.Module):
    """(B, T, d) → (B, T, d): the gated short convolution (see the module's docstring)."""

    def __init__(self, d_model: int, shape: ShortConvShape) -> None:
        super().__init__()
        self.shape = shape
        self.in_bcx = Linear(d_model, 3 * d_model, bias=shape.bias)       # B, C, x: all of B, then C, then x
        self.conv = CausalConv(d_model, shape.kernel, bias=shape.bias)
        self.out = Linear(d_model, d_model, bias=shape.bias)

    def make_state(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device,
                   reserve: int | None) -> RecurrentState:
        """This layer's cache slot: the convolution's last kernel − 1 inputs, whatever the length."""
        return RecurrentState(batch, self.out.weight.size(0), self.shape.kernel, dtype, device)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        T = x.size(1)
        slot = step.cache.slot(step.layer, T) if step.cache is not None else None
        b, c, h = self.in_bcx(x).chunk(3, dim=-1)                         # (B, T, d) each
        h = b * h                                                         # the input gate: B ⊙ x
        if step.pad is not None:                                          # a pad writes nothing in the window
            h = h * step.pad.key_mask[:, -T:, None].to(h.dtype)
        h = self.conv(h, slot)                                            # (B, T, d): the last kernel positions
        step.tap("short_conv", h)
        return self.out(c * h)                                            # the output gate: C ⊙ conv
