"""A key/value cache, so generation runs the trace with T = 1.

Layout per layer: (B, n_kv_heads, capacity, head_dim). Keys are stored after RoPE (Llama),
so a cached key never needs rotating again. The cache holds at most ``max_len`` positions; its
storage starts at ``reserve`` positions and doubles when a step needs more, so a long ``-n`` on a
long-context model costs memory only for the positions actually generated.

With a sliding ``window`` (every layer attends to its last ``window`` positions only, as in
Mistral) the cache keeps no more than a query can still see: when the storage is full, the last
window − 1 positions move to its front and the older ones are forgotten, so memory stays within
about twice the window however long the generation runs. Slot 0 then holds position ``offset``.
"""

from __future__ import annotations

import torch


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
    ) -> None:
        self.max_len = max_len
        self.window = window
        capacity = max_len if reserve is None else max(1, min(reserve, max_len))
        if window is not None:
            capacity = min(capacity, 2 * window)
        self.k = torch.zeros((n_layers, batch, n_kv_heads, capacity, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.pos = 0  # how many positions are already stored
        self.offset = 0  # the position slot 0 holds (0 unless a window let older positions go)
        self._next_layer = 0  # the layer whose keys/values come next in this step
        # a padded batch (``pad_step``): per slot, a real token or a pad, and its position in its sequence
        self.mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch: int, max_len: int, reserve: int | None = None) -> KVCache:
        cfg = model.config
        weight = next(model.parameters())
        return cls(cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim, weight.dtype, weight.device, reserve,
                   cache_window(cfg))

    @property
    def capacity(self) -> int:
        return self.k.size(3)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new (B, n_kv, T, hd) keys/values of ``layer``; return the keys/values this step's
        queries can see: (B, n_kv, past + T, hd), the new ones last (``past`` = what is returned − T).
        Every layer stores each step once, in order; after the last one the cache moves past the step
        (a layer that skipped the cache would otherwise leave it silently behind)."""
        if layer != self._next_layer:
            raise ValueError(f"KV cache: layer {layer} stored where layer {self._next_layer} was expected "
                             "(every layer stores each step once, in order)")
        t = k.size(2)
        end = self.pos + t
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        if layer == 0 and end - self.offset > self.capacity:
            self._make_room(t)
        first = self.pos - self.offset
        if self.window is not None:  # the first new query sees back to pos − window + 1
            first = max(0, first - (self.window - 1))
        else:
            first = 0
        self.k[layer, :, :, self.pos - self.offset : end - self.offset] = k
        self.v[layer, :, :, self.pos - self.offset : end - self.offset] = v
        keys, values = self.k[layer, :, :, first : end - self.offset], self.v[layer, :, :, first : end - self.offset]
        self._next_layer = (layer + 1) % self.k.size(0)
        if self._next_layer == 0:
            self.pos = end
        return keys, values

    def pad_step(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Before a step of a padded batch, ``mask`` (B, T) True for real tokens: stores it and returns
        each new token's position in its own sequence (B, T), and for every key the step sees whether
        it is real and its position (B, past + T each). Once a batch is padded the cache keeps every
        key (pads make slots and positions differ, so a window is applied in attention, by position)."""
        b, t = mask.shape
        if self.mask is None:
            if self.offset:
                raise ValueError("KV cache: a padded step after a window let positions go; "
                                 "start a padded batch on a fresh cache")
            self.mask = torch.ones(b, self.capacity, dtype=torch.bool, device=self.k.device)
            self.positions = torch.arange(self.capacity, device=self.k.device).expand(b, -1).clone()
            self.window = None
        end = self.pos + t
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        if end > self.capacity:
            self._make_room(t)
        seen = self.mask[:, : self.pos].sum(1, keepdim=True)       # (B, 1): real tokens so far
        positions = (seen + mask.long().cumsum(1) - 1).clamp_min(0)  # (B, T)
        self.mask[:, self.pos : end] = mask
        self.positions[:, self.pos : end] = positions
        return positions, self.mask[:, :end], self.positions[:, :end]

    def _make_room(self, t: int) -> None:
        """Before layer 0 stores a step of ``t`` positions: forget what no query can see any more
        (windowed), then grow if the step still does not fit."""
        if self.window is not None:
            keep_from = max(self.offset, self.pos - (self.window - 1))
            if keep_from > self.offset:
                kept = self.pos - keep_from
                for store in (self.k, self.v):
                    store[:, :, :, :kept] = store[:, :, :, keep_from - self.offset : self.pos - self.offset].clone()
                self.offset = keep_from
        need = self.pos + t - self.offset
        if need > self.capacity:
            limit = self.max_len if self.window is None else min(self.max_len, max(need, 2 * self.window))
            self._grow(min(limit, max(need, 2 * self.capacity)))

    def _grow(self, capacity: int) -> None:
        # every layer's stored positions move; layers later in this step have not written theirs yet
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:3], capacity, old.size(4)))
            new[:, :, :, : old.size(3)] = old
            setattr(self, name, new)
        for name in ("mask", "positions") if self.mask is not None else ():
            old = getattr(self, name)
            new = old.new_zeros((old.size(0), capacity))
            new[:, : old.size(1)] = old
            setattr(self, name, new)


def cache_window(config: object) -> int | None:
    """The window every layer of ``config`` attends within, or None when some layer sees everything
    (Gemma's global layers: each layer then applies its own window in attention)."""
    if any(kind != "sliding_attention" for kind in getattr(config, "layer_types", ())):
        return None
    return getattr(config, "sliding_window", None)
