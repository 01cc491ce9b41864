"""The MLPs of a block, each (B, T, d) → (B, T, d): gated (SwiGLU, GeGLU) and routed (MoE).

A gated MLP is down(act(gate(x)) ⊙ up(x)), d → d_ff → d; the activation names it. GPT-2's
ungated GELU MLP lives with GPT-2 (``families/gpt2.py``), the one family that has it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .linear import Linear
from .tap import Tap, no_tap


def swiglu(x: torch.Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
    """down(silu(gate(x)) ⊙ up(x)): d → d_ff → d."""
    return down(F.silu(gate(x)) * up(x))


def geglu(x: torch.Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
    """down(gelu(gate(x)) ⊙ up(x)): d → d_ff → d, GELU in its tanh approximation (HF's gelu_pytorch_tanh)."""
    return down(F.gelu(gate(x), approximate="tanh") * up(x))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int, bias: bool = False) -> None:
        super().__init__()
        self.gate = Linear(d_model, d_ff, bias=bias)
        self.up = Linear(d_model, d_ff, bias=bias)
        self.down = Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        return swiglu(x, self.gate, self.up, self.down)


class ClampedSwiGLU(nn.Module):
    """gpt-oss's experts: down((clamp(up(x), ±limit) + 1) ⊙ g · sigmoid(alpha · g)), g = gate(x) clamped
    to ≤ limit; every projection with a bias."""

    def __init__(self, d_model: int, d_ff: int, limit: float, alpha: float) -> None:
        super().__init__()
        self.gate = Linear(d_model, d_ff, bias=True)
        self.up = Linear(d_model, d_ff, bias=True)
        self.down = Linear(d_ff, d_model, bias=True)
        self.limit, self.alpha = limit, alpha

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        g = self.gate(x).clamp(max=self.limit)                      # (…, d_ff)
        u = self.up(x).clamp(-self.limit, self.limit)               # (…, d_ff)
        return self.down((u + 1) * (g * torch.sigmoid(g * self.alpha)))


class GeGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate = Linear(d_model, d_ff, bias=False)
        self.up = Linear(d_model, d_ff, bias=False)
        self.down = Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        return geglu(x, self.gate, self.up, self.down)


def mix_experts(x: torch.Tensor, experts: nn.ModuleList, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Each token's chosen experts' outputs × their weights, summed: x (N, d), weights and chosen (N, k)."""
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)          # the tokens that chose expert e
        if token.numel():
            out.index_add_(0, token, (expert(x[token]) * weights[token, slot, None]).to(x.dtype))
    return out


class MoE(nn.Module):
    """A sparse MLP: a linear router scores the experts per token; the top ``top_k`` (by softmax
    probability, renormalised to sum to 1 where ``normalize``, as Mixtral; Qwen3-MoE says so in its
    config) each run their SwiGLU on the token, and their outputs are summed with those weights. With
    ``shared_d_ff`` a shared expert (a SwiGLU of that size) runs on every token too, its output ×
    sigmoid(shared_gate(x)) (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE). gpt-oss: a router with a bias
    (``router_bias``), and experts of its own kind (``expert``: d_model, d_ff → an expert; SwiGLU's by default)."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int, normalize: bool = True,
                 shared_d_ff: int = 0, router_bias: bool = False,
                 expert: Callable[[int, int], nn.Module] = SwiGLU) -> None:
        super().__init__()
        self.top_k, self.normalize = top_k, normalize
        self.router = Linear(d_model, n_experts, bias=router_bias)
        self.experts = nn.ModuleList(expert(d_model, d_ff) for _ in range(n_experts))
        self.shared = SwiGLU(d_model, shared_d_ff) if shared_d_ff else None
        self.shared_gate = Linear(d_model, 1, bias=False) if shared_d_ff else None

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        B, T, d = x.shape
        x = x.reshape(B * T, d)                                     # (N, d): each token routed alone
        scores = self.router(x)                                     # (N, E)
        tap("router", scores)
        probs = F.softmax(scores.float(), dim=-1)                   # (N, E), in float32 as HF does
        weights, chosen = probs.topk(self.top_k, dim=-1)            # (N, k) each
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)       # the chosen k sum to 1
        tap("chosen_experts", chosen)
        out = mix_experts(x, self.experts, weights, chosen)         # (N, d)
        if self.shared is not None:
            out = out + self.gated_shared(x)                        # (N, d): every token
        return out.view(B, T, d)

    def gated_shared(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert's output × sigmoid(shared_gate(x)): (N, d) → (N, d)."""
        return torch.sigmoid(self.shared_gate(x)) * self.shared(x)
