"""Checks every config dataclass runs in ``__post_init__``: sizes and ranges a real model can have,
refused before anything is allocated (a config parser turns the ValueError into an error naming
its file)."""

from __future__ import annotations

MAX_LAYERS = 1024  # no model has more; a count past it is refused before per-layer lists are built


def check_sizes(cfg: object, limits: dict[str, int]) -> None:
    """Refuse sizes that are not positive integers or are beyond any real model, before allocating."""
    for name, limit in limits.items():
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
            raise ValueError(f"{name} = {value!r} is not an integer in 1 … {limit:,}")


def check_range(cfg: object, names: tuple[str, ...], low: float, high: float, low_open: bool = False) -> None:
    """Refuse floats outside [low, high] (or (low, high] with ``low_open``), NaN included."""
    for name in names:
        value = getattr(cfg, name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high
        if not ok or (low_open and value == low):
            raise ValueError(f"{name} = {value!r} is outside {'(' if low_open else '['}{low:g}, {high:g}]")


def check_rope_heads(cfg: object) -> None:
    """Grouped-query heads that divide evenly, and a head_dim RoPE can rotate in pairs."""
    if cfg.n_heads % cfg.n_kv_heads:
        raise ValueError(f"n_heads = {cfg.n_heads} is not a multiple of n_kv_heads = {cfg.n_kv_heads}")
    if cfg.head_dim % 2:
        raise ValueError(f"head_dim = {cfg.head_dim} is odd: RoPE rotates pairs")


def refuse_training(cfg: object, mode: bool) -> None:
    """``model.train()`` on a config with training-time features gptconv does not implement: an error
    naming them (inference is exact without them; in train mode the model would differ from the
    reference)."""
    missing = getattr(cfg, "unsupported_in_training", ())
    if mode and missing:
        from ..errors import GptconvError
        raise GptconvError(f"train mode: this checkpoint's config asks for {', '.join(missing)}, which gptconv does "
                           "not implement (inference is exact without them); set them to 0 to train without")
