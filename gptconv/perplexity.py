"""Perplexity as llama.cpp's ``llama-perplexity`` computes it, and how far a second model's next-token
distributions are from a base model's (the figures of its ``--kl-divergence``).

The text is tokenized once (with BOS where the tokenizer adds one) and cut into non-overlapping windows
of ``ctx`` tokens; the tail shorter than a window is left out. Each window runs on its own, its first
token replaced by BOS where the tokenizer adds one, and only its second half is scored: position j
(ctx/2 ≤ j < ctx − 1) predicts token j + 1, so every scored token has at least ctx/2 tokens of
context. Perplexity is exp(mean negative log-likelihood) over every scored token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import GptconvError
from .results import Result

Ids = list[int] | torch.Tensor  # a text's token ids: a (N,) int64 tensor from Tokenizer.encode_long, or a list
Model = nn.Module | Callable[[torch.Tensor], torch.Tensor]  # ids (1, T) → logits (1, T, V): ours, or llama.cpp


@dataclass
class Agreement(Result):
    """The model against a base model on the same windows (llama-perplexity --kl-divergence's figures):
    KL(base ‖ model) of the next-token distributions per scored position, and how often both rank the
    same token first."""

    base: str
    base_perplexity: float
    delta_perplexity: float  # model − base
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_max: float
    same_top: float


@dataclass
class Perplexity(Result):
    source: str
    text: str
    ctx: int
    windows: int
    scored: int  # tokens scored: windows × (ctx/2 − 1)
    perplexity: float
    nll_mean: float  # nats per scored token
    engine: str  # what ran the model: gptconv and its dtype, or llama.cpp on the file as stored
    against: Agreement | None = None


def windows(ids: Ids, ctx: int, bos_id: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each (1, ctx) window of ``ids`` (its first token replaced by ``bos_id`` when not None) and the
    tokens it scores (those at ctx/2 + 1 … ctx − 1)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    for start in range(0, len(ids) - ctx + 1, ctx):
        window = ids[start:start + ctx].clone()[None]
        if bos_id is not None:
            window[0, 0] = bos_id
        yield window, ids[start + ctx // 2 + 1:start + ctx]  # the tokens scored


def check_windows(ids: Ids, ctx: int, context_length: int, origin: object, flag: str = "--ctx") -> None:
    if ctx < 4 or ctx % 2:
        raise GptconvError(f"{flag} {ctx}: use an even window of at least 4 tokens")
    if ctx > context_length:
        raise GptconvError(f"{flag} {ctx}: the model has {context_length} positions")
    if len(ids) < ctx:
        raise GptconvError(f"{origin}: {len(ids)} tokens, fewer than one window of {ctx}")


@torch.no_grad()
def log_probs(model: Model, window: torch.Tensor) -> torch.Tensor:
    """(ctx/2 − 1, V) float32 log-probabilities of the positions a window scores."""
    ctx = window.size(1)
    if isinstance(model, nn.Module):
        window = window.to(next(model.parameters()).device)
    logits = model(window)[0, ctx // 2:ctx - 1]                # (ctx/2 − 1, V)
    if not bool(torch.isfinite(logits).all()):  # a perplexity of NaN is no measurement
        bad = "NaN" if bool(logits.isnan().any()) else "Inf"
        raise GptconvError(f"the model's logits hold {bad}: its weights or activations overflow (a fine-tune gone "
                           "wrong, or a dtype too narrow for it); there is no perplexity to give")
    return F.log_softmax(logits.float(), dim=-1).cpu()


def measure(model: Model, ids: Ids, ctx: int, bos_id: int | None, base: Model | None = None,
            on_window: Callable[[int, int], None] = lambda n, total: None) -> dict:
    """Negative log-likelihoods (and, with ``base``, the base's, KL and top-1 agreement) over the windows."""
    total = len(ids) // ctx
    nll, base_nll, kls, same = [], [], [], 0
    for n, (window, targets) in enumerate(windows(ids, ctx, bos_id)):
        lp = log_probs(model, window)
        nll.append(-lp.gather(1, targets[:, None])[:, 0].double())
        if base is not None:
            lb = log_probs(base, window)
            base_nll.append(-lb.gather(1, targets[:, None])[:, 0].double())
            kls.append((lb.exp() * (lb - lp)).sum(-1).double().clamp_min(0))  # KL(base ‖ model), per position
            same += int((lb.argmax(-1) == lp.argmax(-1)).sum())
        on_window(n + 1, total)
    out = {"windows": total, "nll": torch.cat(nll)}
    if base is not None:
        out.update(base_nll=torch.cat(base_nll), kl=torch.cat(kls), same=same)
    return out


def summarize(source: str, text: str, ctx: int, m: dict, base: str | None, engine: str) -> Perplexity:
    nll = m["nll"].mean().item()
    result = Perplexity(source, text, ctx, m["windows"], m["nll"].numel(), math.exp(nll), nll, engine)
    if base is not None:
        kl = m["kl"]
        base_ppl = math.exp(m["base_nll"].mean().item())
        result.against = Agreement(base, base_ppl, result.perplexity - base_ppl, kl.mean().item(),
                                   kl.median().item(), torch.quantile(kl, 0.99).item(), kl.max().item(),
                                   m["same"] / kl.numel())
    return result
