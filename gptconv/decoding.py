"""Generation: prefill once, then the same trace with T = 1 against the KV cache."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn as nn

from .errors import GptconvError
from .models import KVCache


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (B, V) → ids (B,): greedy when ``temperature == 0``, else sampled from the top k."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate_tokens(model: nn.Module, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
           top_k: int | None = None, seed: int | None = None, stop_ids: set[int] = frozenset()) -> Iterator[int]:
    """Yield new token ids one by one; stops early at a token in ``stop_ids``."""
    limit = model.config.context_length
    total = min(len(prompt) + max_new_tokens, limit)
    if not prompt or len(prompt) >= limit:
        raise GptconvError(f"the prompt has {len(prompt):,} tokens; generation needs 1 … {limit - 1:,} "
                           f"(this model's context holds {limit:,})")
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    # room for the prompt and the first tokens; it grows as generation goes on, up to ``total``
    cache = KVCache.for_model(model, batch=1, max_len=total, reserve=len(prompt) + 256)
    ids = torch.tensor([prompt], device=device)                     # (1, T): the prefill
    for _ in range(total - len(prompt)):
        logits = model(ids, cache=cache, last_only=True)[:, -1]     # (1, V)
        token = next_token(logits, temperature, top_k, generator)  # (1,)
        yield int(token)
        if int(token) in stop_ids:
            return
        ids = token[:, None]                                        # (1, 1): T = 1 from here on


def generate_ids(model: nn.Module, prompt: list[int], max_new_tokens: int, **options) -> list[int]:
    return list(generate_tokens(model, prompt, max_new_tokens, **options))
