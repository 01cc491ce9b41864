"""A preallocated key/value cache, so generation runs the trace with T = 1.

Layout per layer: (B, n_kv_heads, max_len, head_dim). Keys are stored after RoPE (Llama),
so a cached key never needs rotating again.
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
    ) -> None:
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.pos = 0  # how many positions are already stored

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch: int, max_len: int) -> KVCache:
        cfg = model.config
        weight = next(model.parameters())
        return cls(cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim, weight.dtype, weight.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new (B, n_kv, T, hd) keys/values of ``layer``; return all keys/values so far."""
        end = self.pos + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        self.k[layer, :, :, self.pos : end] = k
        self.v[layer, :, :, self.pos : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        """Called once per forward, after every layer has stored its ``n`` new positions."""
        self.pos += n
