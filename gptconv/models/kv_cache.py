"""A key/value cache, so generation runs the trace with T = 1.

Layout per layer: (B, n_kv_heads, capacity, head_dim). Keys are stored after RoPE (Llama),
so a cached key never needs rotating again. The cache holds at most ``max_len`` positions; its
storage starts at ``reserve`` positions and doubles when a step needs more, so a long ``-n`` on a
long-context model costs memory only for the positions actually generated.
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
    ) -> None:
        self.max_len = max_len
        capacity = max_len if reserve is None else max(1, min(reserve, max_len))
        self.k = torch.zeros((n_layers, batch, n_kv_heads, capacity, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.pos = 0  # how many positions are already stored
        self._next_layer = 0  # the layer whose keys/values come next in this step

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch: int, max_len: int, reserve: int | None = None) -> KVCache:
        cfg = model.config
        weight = next(model.parameters())
        return cls(cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim, weight.dtype, weight.device, reserve)

    @property
    def capacity(self) -> int:
        return self.k.size(3)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new (B, n_kv, T, hd) keys/values of ``layer``; return all keys/values so far.
        Every layer stores each step once, in order; after the last one the cache moves past the step
        (a layer that skipped the cache would otherwise leave it silently behind)."""
        if layer != self._next_layer:
            raise ValueError(f"KV cache: layer {layer} stored where layer {self._next_layer} was expected "
                             "(every layer stores each step once, in order)")
        end = self.pos + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        if end > self.capacity:
            self._grow(min(self.max_len, max(end, 2 * self.capacity)))
        self.k[layer, :, :, self.pos : end] = k
        self.v[layer, :, :, self.pos : end] = v
        keys, values = self.k[layer, :, :, :end], self.v[layer, :, :, :end]
        self._next_layer = (layer + 1) % self.k.size(0)
        if self._next_layer == 0:
            self.pos = end
        return keys, values

    def _grow(self, capacity: int) -> None:
        # every layer's stored positions move; layers later in this step have not written theirs yet
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:3], capacity, old.size(4)))
            new[:, :, :, : old.size(3)] = old
            setattr(self, name, new)
