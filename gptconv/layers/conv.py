"""The short causal convolution of recurrent layers (Qwen3.5's linear attention, LFM2's conv blocks).

Depthwise: each channel is filtered by its own ``kernel`` taps over its last ``kernel`` positions, its
own included; positions before the first see zeros. Its cache slot keeps the last kernel − 1 inputs,
so generation with T = 1 filters exactly what a whole-sequence pass would.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalConv(nn.Module):
    """(B, T, C) → (B, T, C). ``weight``: (C, kernel), the last tap on the current position."""

    def __init__(self, channels: int, kernel: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, kernel))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

    def forward(self, x: torch.Tensor, slot=None) -> torch.Tensor:
        """``slot``: the layer's cache slot (its ``conv``: (B, C, kernel − 1), the inputs before this
        step), updated to end with this step's inputs; None: no positions before this step."""
        B, T, C = x.shape
        kernel = self.weight.size(1)
        past = slot.conv if slot is not None else x.new_zeros(B, C, kernel - 1)
        seq = torch.cat([past.to(x.dtype), x.transpose(1, 2)], dim=2)     # (B, C, kernel − 1 + T)
        if slot is not None:
            slot.conv = seq[:, :, seq.size(2) - (kernel - 1):].clone()
        y = F.conv1d(seq.to(self.weight.dtype), self.weight[:, None, :], self.bias, groups=C)  # (B, C, T)
        return y.transpose(1, 2).to(x.dtype)
