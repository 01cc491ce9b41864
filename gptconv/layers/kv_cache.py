"""The per-layer state generation runs through, so it runs the trace with T = 1.

``KVCache`` holds one slot per layer, each made by that layer's attention (``make_state``): a
``LayerKV`` with the layer's own window (mlx-lm's ``make_prompt_cache`` does the same), or for a
recurrent layer (linear attention, a short convolution) a ``RecurrentState`` of fixed size. The cache
only keeps them in order, counts the positions stored and, for a padded batch, which keys are real.

A ``LayerKV`` stores (B, n_kv_heads, capacity, head_dim) keys (after RoPE, so a cached key never
needs rotating again) and values, at most ``max_len`` positions; its storage starts at ``reserve``
positions and doubles when a step needs more, so a long ``-n`` on a long-context model costs memory
only for the positions actually generated. With a sliding ``window`` (the layer attends to its last
``window`` positions only: Mistral's every layer, Gemma's local ones) it keeps no more than a query can
still see: when the storage is full, the last window − 1 positions move to its front and the older
ones are forgotten, so its memory stays within about twice the window however long the generation
runs. Its slot 0 then holds position ``offset``.
"""

from __future__ import annotations

import torch


class LayerKV:
    """One attention layer's keys and values."""

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", reserve: int | None = None, window: int | None = None,
                 v_dim: int | None = None) -> None:
        """``v_dim``: the values' width where it is not the keys' (multi-head latent attention stores its
        latent as the "keys" and its rotated key part as the "values", ``layers/mla.py``)."""
        self.max_len, self.window = max_len, window
        capacity = max_len if reserve is None else max(1, min(reserve, max_len))
        if window is not None:
            capacity = min(capacity, 2 * window)
        self.k = torch.zeros((batch, n_kv_heads, capacity, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros((batch, n_kv_heads, capacity, head_dim if v_dim is None else v_dim), dtype=dtype,
                             device=device)
        self.offset = 0  # the position slot 0 holds (0 unless a window let older positions go)

    @property
    def capacity(self) -> int:
        return self.k.size(2)

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def nbytes(self) -> int:
        return (self.k.numel() + self.v.numel()) * self.k.element_size()

    def store(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the (B, n_kv, T, hd) keys/values of positions pos … pos + T − 1; return those the step's
        queries can see: (B, n_kv, past + T, hd), the new ones last."""
        end = pos + k.size(2)
        if end - self.offset > self.capacity:
            self._make_room(pos, end)
        first = 0 if self.window is None else max(0, pos - self.offset - (self.window - 1))  # the first query's reach
        self.k[:, :, pos - self.offset:end - self.offset] = k
        self.v[:, :, pos - self.offset:end - self.offset] = v
        return self.k[:, :, first:end - self.offset], self.v[:, :, first:end - self.offset]

    def _make_room(self, pos: int, end: int) -> None:
        """Forget what no query can see any more (windowed), then grow if the step still does not fit."""
        if self.window is not None:
            keep_from = max(self.offset, pos - (self.window - 1))
            if keep_from > self.offset:
                kept = pos - keep_from
                for store in (self.k, self.v):
                    store[:, :, :kept] = store[:, :, keep_from - self.offset:pos - self.offset].clone()
                self.offset = keep_from
        need = end - self.offset
        if need > self.capacity:
            limit = self.max_len if self.window is None else min(self.max_len, max(need, 2 * self.window))
            self.grow(min(limit, max(need, 2 * self.capacity)))

    def grow(self, capacity: int) -> None:
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:2], capacity, old.size(3)))
            new[:, :, :old.size(2)] = old
            setattr(self, name, new)


class RecurrentState:
    """A recurrent layer's slot: the last ``kernel − 1`` inputs of its short convolution (B, C, kernel − 1),
    and where it has one, its recurrent state (B, *recurrent), in float32 (a gated delta rule's S per
    value head: (heads, k_dim, v_dim)). Its size does not depend on how many positions it has seen."""

    offset = 0  # as LayerKV's: it forgets nothing it would still need
    capacity = 0  # positions it stores

    def __init__(self, batch: int, channels: int, kernel: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", recurrent: tuple[int, ...] | None = None) -> None:
        self.conv = torch.zeros((batch, channels, kernel - 1), dtype=dtype, device=device)
        self.recurrent = (torch.zeros((batch, *recurrent), dtype=torch.float32, device=device)
                          if recurrent is not None else None)
        self.window = None

    @property
    def device(self) -> torch.device:
        return self.conv.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv, self.recurrent) if t is not None)


class SharedKV:
    """A KV-shared layer's slot (Gemma 4's last layers): it stores nothing; its attention reads the keys and
    values its ``source`` layer stored this step. It refers to that layer's slot, not a copy."""

    def __init__(self, source: int) -> None:
        self.source = source
        self.of: LayerKV | None = None  # the source's slot, set by the cache
        self.window = None

    @property
    def capacity(self) -> int:
        return self.of.capacity

    @property
    def offset(self) -> int:
        return self.of.offset

    @property
    def nbytes(self) -> int:
        return 0


class KVCache:
    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        reserve: int | None = None,
        window: int | None = None,
        layers: list[LayerKV] | None = None,
    ) -> None:
        """A cache of ``n_layers`` alike slots; or, given ``layers``, of those (``for_model``)."""
        self.max_len = max_len
        self.layers = layers if layers is not None else [
            LayerKV(batch, n_kv_heads, head_dim, max_len, dtype, device, reserve, window) for _ in range(n_layers)]
        self.pos = 0  # how many positions are already stored
        self._next_layer = 0  # the layer whose keys/values come next in this step
        # a padded batch (``pad_step``): per position, a real token or a pad, and its position in its sequence
        self.mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch: int, max_len: int, reserve: int | None = None) -> KVCache:
        """A slot per layer, each made by the layer's attention for itself (its heads, its window)."""
        weight = next(model.parameters())
        layers = [block.attn.make_state(batch, max_len, weight.dtype, weight.device, reserve) for block in model.blocks]
        for slot in layers:
            if isinstance(slot, SharedKV):
                slot.of = layers[slot.source]
        return cls(len(layers), batch, n_kv_heads=0, max_len=max_len, head_dim=0, layers=layers)

    @property
    def window(self) -> int | None:
        """The window every layer keeps, or None where some layer keeps everything."""
        windows = {slot.window for slot in self.layers}
        return windows.pop() if len(windows) == 1 else None

    @property
    def capacity(self) -> int:
        """The most positions a layer holds now."""
        return max(slot.capacity for slot in self.layers)

    @property
    def offset(self) -> int:
        """The oldest position every layer still holds."""
        return min(slot.offset for slot in self.layers)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new (B, n_kv, T, hd) keys/values of ``layer``; return the keys/values this step's
        queries can see: (B, n_kv, past + T, hd), the new ones last (``past`` = what is returned − T).
        Every layer stores each step once, in order; after the last one the cache moves past the step
        (a layer that skipped the cache would otherwise leave it silently behind)."""
        pos = self.pos
        return self.slot(layer, k.size(2)).store(pos, k, v)

    def slot(self, layer: int, t: int):
        """The slot of ``layer`` for a step of ``t`` positions, taken once per step, in order (an attention
        layer through ``update``, a recurrent layer directly: it updates its state itself)."""
        if layer != self._next_layer:
            raise ValueError(f"KV cache: layer {layer} stored where layer {self._next_layer} was expected "
                             "(every layer stores each step once, in order)")
        end = self.pos + t
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        self._next_layer = (layer + 1) % len(self.layers)
        if self._next_layer == 0:
            self.pos = end
        return self.layers[layer]

    @property
    def nbytes(self) -> int:
        """The bytes its slots hold now."""
        return sum(slot.nbytes for slot in self.layers)

    def pad_step(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Before a step of a padded batch, ``mask`` (B, T) True for real tokens: stores it and returns
        each new token's position in its own sequence (B, T), and for every key the step sees whether
        it is real and its position (B, past + T each). Once a batch is padded every layer keeps every
        key (pads make slots and positions differ, so a window is applied in attention, by position)."""
        b, t = mask.shape
        if self.mask is None:
            if any(slot.offset for slot in self.layers):
                raise ValueError("KV cache: a padded step after a window let positions go; "
                                 "start a padded batch on a fresh cache")
            device = self.layers[0].device
            self.mask = torch.ones(b, self.capacity, dtype=torch.bool, device=device)
            self.positions = torch.arange(self.capacity, device=device).expand(b, -1).clone()
            for slot in self.layers:
                slot.window = None
        end = self.pos + t
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        if end > self.mask.size(1):
            self._grow_mask(min(self.max_len, max(end, 2 * self.mask.size(1))))
        seen = self.mask[:, :self.pos].sum(1, keepdim=True)        # (B, 1): real tokens so far
        positions = (seen + mask.long().cumsum(1) - 1).clamp_min(0)  # (B, T)
        self.mask[:, self.pos:end] = mask
        self.positions[:, self.pos:end] = positions
        return positions, self.mask[:, :end], self.positions[:, :end]

    def _grow_mask(self, capacity: int) -> None:
        for name in ("mask", "positions"):
            old = getattr(self, name)
            new = old.new_zeros((old.size(0), capacity))
            new[:, :old.size(1)] = old
            setattr(self, name, new)


def sliding_window(config: object) -> int | None:
    """The window ``config``'s sliding layers attend within (None: no layer slides): the decoder's
    ``attention.window``, or the ``sliding_window`` field of a config that has one (Gemma's)."""
    options = getattr(config, "attention", None)
    return options.window if options is not None else getattr(config, "sliding_window", None)


def cache_window(config: object) -> int | None:
    """The window every layer of ``config`` attends within, or None when some layer sees everything
    (Gemma's global layers: each layer then applies its own window in attention)."""
    if any(kind != "sliding_attention" for kind in getattr(config, "layer_types", ())):
        return None
    return sliding_window(config)
