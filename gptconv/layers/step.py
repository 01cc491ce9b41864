"""One forward call's shared state: where its tokens are, their padding, the cache, the tap; and, for
one layer, which layer it is and its RoPE angles. Every block and attention layer takes a ``Step``."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import GptconvError
from .attention import Padding
from .rope import rope_angles
from .tap import Tap, no_tap


@dataclass(frozen=True)
class Step:
    start: int  # the position of the first token (what the cache already holds)
    length: int  # T
    device: torch.device
    pad: Padding | None  # None: nothing padded
    cache: object | None  # KVCache, or None: no cache (prefill without one, or training)
    tap: Tap  # at the model: sees "token_embedding", "block.3", …; at a layer: "q_norm" as "block.3.q_norm"
    reach: int  # the positions this step reaches: start + T (padded: the longest sequence's)
    layer: int = -1  # the layer this step is at (``at``), -1 at the model
    cos: torch.Tensor | None = None  # that layer's RoPE angles: (T, hd), or (B, 1, T, hd) when padded
    sin: torch.Tensor | None = None

    @classmethod
    def begin(cls, ids: torch.Tensor, cache, attention_mask: torch.Tensor | None, tap: Tap,
              context_length: int) -> Step:
        """The step for token ids (B, T); ``attention_mask`` (B, T), 0 at pad tokens (left or right). The
        positions it reaches must fit the model's context."""
        B, T = ids.shape
        start = cache.pos if cache is not None else 0
        pad = Padding.of(attention_mask, cache, B, T, ids.device)
        n = Padding.reach(pad, start, T)
        if n > context_length:
            raise GptconvError(f"{n} positions asked for; the model has {context_length}")
        return cls(start, T, ids.device, pad, cache, tap, n)

    @property
    def positions(self) -> torch.Tensor:
        """Each token's position: (T,), or (B, T) when padded (its position in its own sequence)."""
        if self.pad is not None:
            return self.pad.positions
        return torch.arange(self.start, self.start + self.length, device=self.device)

    def angles(self, inv_freq: torch.Tensor, dtype: torch.dtype,
               factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin at this step's positions for the frequencies ``inv_freq`` (× ``factor``)."""
        return rope_angles(inv_freq, self.start, self.length, dtype, Padding.positions_of(self.pad), factor)

    def at(self, layer: int, angles: tuple[torch.Tensor, torch.Tensor] | None = None) -> Step:
        """This step at ``layer`` (with its RoPE angles), its tap naming the steps inside the layer."""
        tap = self.tap
        inner = no_tap if tap is no_tap else (lambda name, t: tap(f"block.{layer}.{name}", t))
        cos, sin = angles if angles is not None else (None, None)
        return replace(self, layer=layer, tap=inner, cos=cos, sin=sin)
