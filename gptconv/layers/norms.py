"""Norms, named by convention: each takes (…, d) and returns (…, d) in the input's dtype.

- ``rms_norm``: x / √(mean(x²) + eps) · w (Llama's convention: weights start at 1);
- ``offset_rms_norm``: x / √(mean(x²) + eps) · (1 + w) (Gemma's convention: weights are stored as
  their offset from 1, so a zero weight is the identity).
LayerNorm (GPT-2, GPT-NeoX: x − mean, / std, · w + b) is torch's own ``nn.LayerNorm``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config_checks import check_range

NORM_PLACES = ("pre", "post", "sandwich", "parallel")
NORM_KINDS = ("rms", "layer")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + eps) · weight, the mean taken in float32 (as HF and llama.cpp do)."""
    return weight * F.rms_norm(x.float(), (x.size(-1),), eps=eps).to(x.dtype)  # one fused op, same rounding


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + eps) · (1 + weight), all in float32 and rounded once at the end (as HF's
    Gemma norms; ``rms_norm`` rounds before the weight)."""
    return (F.rms_norm(x.float(), (x.size(-1),), eps=eps) * (1.0 + weight.float())).to(x.dtype)


def rms_norm_f32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + eps) · w, all in float32 and rounded once at the end (Gemma 4's)."""
    return (F.rms_norm(x.float(), (x.size(-1),), eps=eps) * weight.float()).to(x.dtype)


def plain_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + eps), no weight (Gemma 4's V and its router's input), in float32."""
    return F.rms_norm(x.float(), (x.size(-1),), eps=eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class F32RMSNorm(RMSNorm):
    """RMSNorm scaling by w in float32, rounded once (Gemma 4's; ``RMSNorm`` rounds before the weight)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_f32(x, self.weight, self.eps)


class OffsetRMSNorm(nn.Module):
    """RMSNorm scaling by (1 + w)."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))  # zero: the identity scale
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return offset_rms_norm(x, self.weight, self.eps)


@dataclass(frozen=True)
class Norms:
    """A decoder's norms: their ``kind`` ("rms": RMSNorm; "layer": LayerNorm with a bias, GPT-NeoX), ``eps``,
    convention (``offset``: an RMSNorm scaling by 1 + w, weights stored as offsets from 1, the q/k norms too),
    and where a block puts them (``place``): "pre", before each sublayer; "post", on its output before the
    residual add (OLMo 2, EXAONE 4); "sandwich", both; "parallel", before each sublayer, both reading the
    block's input, their outputs added to it together (GPT-NeoX: x + attn(norm1(x)) + mlp(norm2(x)))."""

    eps: float = 1e-5
    offset: bool = False
    place: str = "pre"
    kind: str = "rms"

    def __post_init__(self) -> None:
        try:
            check_range(self, ("eps",), 0.0, 1.0, low_open=True)
        except ValueError as e:
            raise ValueError(f"norms: {e}") from None
        if self.place not in NORM_PLACES:
            raise ValueError(f"norms: place '{self.place}' unknown ({', '.join(NORM_PLACES)})")
        if self.kind not in NORM_KINDS or (self.offset and self.kind != "rms"):
            raise ValueError(f"norms: kind '{self.kind}'{' with 1 + w' if self.offset else ''} unknown "
                             f"({', '.join(NORM_KINDS)}; 1 + w for rms only)")

    def make(self, d: int, eps: float = 0.0) -> nn.Module:
        """A norm of this convention over d features (``eps``: its own, where not the model's)."""
        if self.kind == "layer":
            return nn.LayerNorm(d, eps=eps or self.eps)
        return (OffsetRMSNorm if self.offset else RMSNorm)(d, eps or self.eps)

    @property
    def pre(self) -> bool:
        return self.place in ("pre", "sandwich", "parallel")

    @property
    def parallel(self) -> bool:
        return self.place == "parallel"

    @property
    def post(self) -> bool:
        return self.place in ("post", "sandwich")
