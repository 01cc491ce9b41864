"""Generation: prefill once, then the same trace with T = 1 against the KV cache.

One prompt (``generate_tokens``, streamed) or several of different lengths (``generate_batch``): those
are left-padded into one batch whose attention mask the cache carries, so each gets the tokens it
gets alone (greedy: the same tokens), and each stops at its own stop token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn as nn

from .errors import GptconvError
from .models import KVCache


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
               generator: torch.Generator | None = None, top_p: float | None = None) -> torch.Tensor:
    """logits (B, V) → ids (B,): greedy when ``temperature == 0``, else sampled from the k most likely
    (``top_k``) and, of those, the fewest whose probabilities reach ``top_p`` (nucleus sampling).
    Logits holding NaN or Inf give no distribution, greedy or sampled: an error, not a token."""
    check_top_p(top_p)
    if not bool(torch.isfinite(logits).all()):
        bad = "NaN" if bool(logits.isnan().any()) else "Inf"
        raise GptconvError(f"the model's next-token logits hold {bad}: its weights or activations overflow "
                           "(a fine-tune gone wrong, or a dtype too narrow for it); there is no token to choose")
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ranked, order = logits.sort(dim=-1, descending=True)       # (B, V), most likely first
        probs = torch.softmax(ranked, dim=-1)
        beyond = probs.cumsum(-1) - probs >= top_p                   # the mass before it already reaches p
        logits = logits.scatter(-1, order, ranked.masked_fill(beyond, float("-inf")))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_top_p(top_p: float | None) -> None:
    if top_p is not None and not (isinstance(top_p, (int, float)) and not isinstance(top_p, bool)
                                  and 0.0 < top_p <= 1.0):
        raise GptconvError(f"--top-p {top_p!r}: use a probability in (0, 1]")


MAX_NEW_TOKENS = 1 << 20
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed's range


def check_options(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None,
                  seed: int | None) -> None:
    """generate's options, checked once for the command line and the library alike (before anything loads)."""
    def integer(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)
    if not integer(max_new_tokens) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise GptconvError(f"--max-new-tokens {max_new_tokens!r}: use a whole number in 1 … {MAX_NEW_TOKENS:,}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not 0.0 <= temperature <= MAX_TEMPERATURE:  # NaN fails every comparison
        raise GptconvError(f"--temperature {temperature!r}: use a number in 0 … {MAX_TEMPERATURE:g} (0 is greedy)")
    if top_k is not None and (not integer(top_k) or top_k < 1):
        raise GptconvError(f"--top-k {top_k!r}: use a whole number of at least 1")
    check_top_p(top_p)
    if seed is not None and (not integer(seed) or not 0 <= seed <= MAX_SEED):
        raise GptconvError(f"--seed {seed!r}: use a whole number in 0 … 2^63 − 1")


def _check_prompt(prompt: list[int], limit: int) -> None:
    if not prompt or len(prompt) >= limit:
        raise GptconvError(f"the prompt has {len(prompt):,} tokens; generation needs 1 … {limit - 1:,} "
                           f"(this model's context holds {limit:,})")


# inference mode, not just no_grad: no autograd bookkeeping on any tensor, which a decode step's ~50 small
# ops a layer feel (SmolLM2-135M, measured: 7 % less time per token in float32, 10 % in bfloat16)
@torch.inference_mode()
def generate_tokens(model: nn.Module, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
                    top_k: int | None = None, seed: int | None = None, stop_ids: set[int] = frozenset(),
                    top_p: float | None = None) -> Iterator[int]:
    """Yield new token ids one by one; stops early at a token in ``stop_ids``."""
    limit = model.config.context_length
    _check_prompt(prompt, limit)
    total = min(len(prompt) + max_new_tokens, limit)
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    # room for the prompt and the first tokens; it grows as generation goes on, up to ``total``
    cache = KVCache.for_model(model, batch=1, max_len=total, reserve=len(prompt) + 256)
    ids = torch.tensor([prompt], device=device)                     # (1, T): the prefill
    seq = ids
    for _ in range(total - len(prompt)):
        if _stale(model, cache, ids):                               # recompute the whole sequence once
            cache = KVCache.for_model(model, batch=1, max_len=total, reserve=seq.shape[1] + 256)
            ids = seq
        logits = model(ids, cache=cache, last_only=True)[:, -1]     # (1, V)
        token = next_token(logits, temperature, top_k, generator, top_p)  # (1,)
        yield int(token)
        if int(token) in stop_ids:
            return
        ids = token[:, None]                                        # (1, 1): T = 1 from here on
        seq = torch.cat([seq, ids], dim=1)


def _stale(model: nn.Module, cache: KVCache, ids: torch.Tensor) -> bool:
    """Whether the cache must be recomputed before this step (``cache_stale``: longrope's switch)."""
    stale = getattr(model, "cache_stale", None)
    return stale is not None and stale(cache.pos, cache.pos + ids.shape[1])


def generate_ids(model: nn.Module, prompt: list[int], max_new_tokens: int, **options) -> list[int]:
    return list(generate_tokens(model, prompt, max_new_tokens, **options))


@torch.inference_mode()
def generate_batch(model: nn.Module, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                   top_k: int | None = None, seed: int | None = None, stop_ids: set[int] = frozenset(),
                   top_p: float | None = None, pad_id: int = 0,
                   done: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """The new tokens of each prompt, generated together: left-padded to one length (``pad_id``, masked
    out), so that every sequence's next token comes from the last column. A sequence that reached a
    token in ``stop_ids``, its own context limit or ``done(its new tokens)`` stops; the batch runs until
    all have, a finished sequence's further tokens masked out as pads."""
    limit = model.config.context_length
    for prompt in prompts:
        _check_prompt(prompt, limit)
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    t = max(len(p) for p in prompts)
    budget = [min(max_new_tokens, limit - len(p)) for p in prompts]  # each prompt's own room
    ids = torch.full((len(prompts), t), pad_id, device=device)      # (B, T), left-padded
    mask = torch.zeros(len(prompts), t, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        ids[i, t - len(p):] = torch.tensor(p, device=device)
        mask[i, t - len(p):] = True
    steps = max(budget)
    cache = KVCache.for_model(model, batch=len(prompts), max_len=t + steps, reserve=t + min(steps, 256))
    out: list[list[int]] = [[] for _ in prompts]
    running = [b > 0 for b in budget]
    seq, seq_mask = ids, mask
    for _ in range(steps):
        if _stale(model, cache, ids):                               # recompute the whole batch once
            cache = KVCache.for_model(model, batch=len(prompts), max_len=t + steps, reserve=seq.shape[1] + 256)
            ids, mask = seq, seq_mask
        logits = model(ids, cache=cache, last_only=True, attention_mask=mask)[:, -1]  # (B, V)
        tokens = next_token(logits, temperature, top_k, generator, top_p)  # (B,)
        for i, token in enumerate(tokens.tolist()):
            if running[i]:
                out[i].append(token)
                running[i] = token not in stop_ids and len(out[i]) < budget[i] and not (done and done(out[i]))
        if not any(running):
            break
        ids = tokens[:, None]                                       # (B, 1)
        mask = torch.tensor(running, device=device)[:, None]        # a finished row's tokens are pads
        seq, seq_mask = torch.cat([seq, ids], dim=1), torch.cat([seq_mask, mask], dim=1)
    return out
