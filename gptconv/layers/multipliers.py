"""µP's multipliers (Granite): where a model scales its residual stream, attention and logits apart from
Llama's 1s and head_dim^-½. The decoder applies them (``decoder.Decoder``, ``decoder.Block``); a model
without them has ``Multipliers()``."""

from __future__ import annotations

from dataclasses import dataclass

from .config_checks import check_range


@dataclass(frozen=True)
class Multipliers:
    embedding: float = 1.0  # the token embedding ×
    residual: float = 1.0  # each sublayer's output × before the residual add
    attention: float | None = None  # attention scores × (None: head_dim^-½)
    logits: float = 1.0  # the logits ÷

    def __post_init__(self) -> None:
        try:
            check_range(self, ("embedding", "residual", "logits"), 0.0, 1e6, low_open=True)
            if self.attention is not None:
                check_range(self, ("attention",), 0.0, 1e6, low_open=True)
        except ValueError as e:
            raise ValueError(f"µP multipliers: {e}") from None

    @property
    def applied(self) -> bool:
        """Whether any differs from Llama's."""
        return self != Multipliers()
