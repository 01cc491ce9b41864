"""The MLPs of a block, each (B, T, d) → (B, T, d): gated (SwiGLU, GeGLU), ungated (``DenseMLP``: GPT-NeoX's
GELU) and routed (MoE).

A gated MLP is down(act(gate(x)) ⊙ up(x)), d → d_ff → d; the activation names it. An ungated one is
down(act(up(x))). The decoder's dense MLP is chosen by its ``MLPOptions``. GPT-2's GELU MLP (its Conv1D
layout) lives with GPT-2 (``families/gpt2.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

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


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu,  # GELU exact (erf): HF's "gelu"
               "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}  # HF's gelu_new, gelu_pytorch_tanh


@dataclass(frozen=True)
class MLPOptions:
    """A decoder's dense MLP: ``gated`` (down(act(gate(x)) ⊙ up(x)), Llama's SwiGLU) or not (down(act(up(x))),
    GPT-NeoX), its activation (``act``: silu, gelu, gelu_tanh) and whether its projections have biases."""

    gated: bool = True
    act: str = "silu"
    bias: bool = False

    def __post_init__(self) -> None:
        if self.act not in ACTIVATIONS:
            raise ValueError(f"MLP: activation '{self.act}' is not supported ({', '.join(ACTIVATIONS)})")
        if self.gated and self.act == "gelu":
            raise ValueError("MLP: a gated MLP with exact GELU is not supported (gated: silu, gelu_tanh)")

    def make(self, d_model: int, d_ff: int) -> nn.Module:
        if not self.gated:
            return DenseMLP(d_model, d_ff, self.act, self.bias)
        return SwiGLU(d_model, d_ff, self.bias) if self.act == "silu" else GeGLU(d_model, d_ff, self.bias)


class DenseMLP(nn.Module):
    """The ungated MLP: down(act(up(x))), d → d_ff → d (GPT-NeoX's dense_h_to_4h, dense_4h_to_h)."""

    def __init__(self, d_model: int, d_ff: int, act: str = "gelu", bias: bool = True) -> None:
        super().__init__()
        self.up = Linear(d_model, d_ff, bias=bias)
        self.down = Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


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
    def __init__(self, d_model: int, d_ff: int, bias: bool = False) -> None:
        super().__init__()
        self.gate = Linear(d_model, d_ff, bias=bias)
        self.up = Linear(d_model, d_ff, bias=bias)
        self.down = Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        return geglu(x, self.gate, self.up, self.down)


def mix_experts(x: torch.Tensor, experts: nn.ModuleList, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Each token's chosen experts' outputs × their weights, summed: x (N, d), weights and chosen (N, k).

    Grouped by expert: one stable sort of the N·k choices puts each expert's tokens together, in token
    order, and one count gives each group's length; each expert that has tokens runs once, on its group,
    and an expert no token chose costs nothing (a scan of the table per expert cost E passes, and on a
    GPU E waits for their results). The outputs are added expert by expert, ascending, each in token
    order: the order of a scan per expert, so the sums are the same to the bit. Each group's rows are
    gathered afresh (``x[t]``), as the scan gathered them: a slice of one gathered copy can start off the
    allocator's alignment, where the BLAS rounds differently (seen at float32, d = 37), and one index_add_
    of all the groups rounds bfloat16 sums once where each expert's add rounded them.
    """
    flat = chosen.reshape(-1)                                   # (N·k,): token t's j-th choice at t·k + j
    order = flat.sort(stable=True).indices                      # (N·k,): by expert, tokens ascending within one
    token = order // chosen.size(1)                             # (N·k,): each choice's token, in that order
    weight = weights.reshape(-1)[order, None]                   # (N·k, 1): each choice's weight, in that order
    counts = torch.bincount(flat, minlength=len(experts)).tolist()  # (E,): tokens per expert
    out = torch.zeros_like(x)
    start = 0
    for e, n in enumerate(counts):
        if n:                                                   # expert e's tokens: [start, start + n)
            t = token[start:start + n]
            out.index_add_(0, t, (experts[e](x[t]) * weight[start:start + n]).to(x.dtype))
            start += n
    return out


@dataclass(frozen=True)
class Experts:
    """A block's routed experts and their router (``MoE``): ``used`` of ``count`` experts per token, each an
    MLP of ``d_ff`` (0: the model's dense d_ff), SwiGLU, or gpt-oss's clamped SwiGLU at ``clamp`` (slope
    ``alpha``). The router scores by softmax or, DeepSeek-V3's, by sigmoid (a ``correction_bias`` added for
    the choice only, ``groups`` (n, k): the best k of n groups first); the chosen weights renormalised to sum
    to 1 where ``renormalise``, × ``scaling``; ``router_bias``: a bias on the router (gpt-oss). A shared expert
    of ``shared_d_ff`` (0: none) runs on every token, × sigmoid(gate(x)) where ``shared_gate``."""

    count: int
    used: int
    d_ff: int = 0
    renormalise: bool = True  # HF's norm_topk_prob
    scoring: str = "softmax"  # or "sigmoid"
    groups: tuple[int, int] = (1, 1)  # (groups, groups kept)
    scaling: float = 1.0  # HF's routed_scaling_factor
    router_bias: bool = False
    correction_bias: bool = False  # a learned per-expert bias on the scores, for the choice only
    shared_d_ff: int = 0
    shared_gate: bool = True
    clamp: float | None = None  # gpt-oss's swiglu_limit: its clamped SwiGLU experts
    alpha: float = 1.702  # … and their gate's sigmoid slope

    def __post_init__(self) -> None:
        try:
            self._check()
        except ValueError as e:
            raise ValueError(f"experts: {e}") from None

    def _check(self) -> None:
        from .config_checks import check_range, check_sizes
        check_sizes(self, {"count": 1024, "used": self.count})
        for name in ("d_ff", "shared_d_ff"):
            if getattr(self, name):
                check_sizes(self, {name: 1 << 20})
        if self.clamp is not None:
            check_range(self, ("clamp", "alpha"), 0.0, 1e6, low_open=True)
        check_range(self, ("scaling",), 0.0, 1e6, low_open=True)
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"router scoring '{self.scoring}': softmax or sigmoid")
        groups, kept = self.groups
        # a group is scored by its best two experts (DeepSeek's and GLM's routing): two at least in each
        if (groups, kept) != (1, 1) and not (groups > 0 and self.count % groups == 0 and self.count // groups >= 2
                                             and 0 < kept <= groups):
            raise ValueError(f"expert_groups {self.groups}: {self.count} experts in {groups} groups of two or more, "
                             f"{kept} of them kept, is not possible")

    def expert(self, d_model: int, d_ff: int) -> nn.Module:
        return SwiGLU(d_model, d_ff) if self.clamp is None else ClampedSwiGLU(d_model, d_ff, self.clamp, self.alpha)


class MoE(nn.Module):
    """A sparse MLP: a linear router scores the experts per token; the top ``top_k`` (by softmax
    probability, renormalised to sum to 1 where ``normalize``, as Mixtral; Qwen3-MoE says so in its
    config) each run their SwiGLU on the token, and their outputs are summed with those weights. With
    ``shared_d_ff`` a shared expert (a SwiGLU of that size) runs on every token too, its output ×
    sigmoid(shared_gate(x)) (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE), or as it is (``shared_gate`` False:
    DeepSeek). gpt-oss: a router with a bias (``router_bias``), and experts of its own kind (``expert``:
    d_model, d_ff → an expert; SwiGLU's by default).

    DeepSeek-V3's routing (``scoring`` "sigmoid"): each expert's score is sigmoid(logit), in float32; the
    choice adds a learned per-expert bias (``correction_bias``) to it and, with ``groups`` (n, k), first keeps
    the k of n groups of experts whose two best scores sum highest; the chosen experts are weighed by their
    scores without the bias (renormalised where ``normalize``), × ``scale`` (routed_scaling_factor)."""

    def __init__(self, d_model: int, d_ff: int, e: Experts) -> None:
        super().__init__()
        self.top_k, self.normalize, self.scoring, self.groups, self.scale = e.used, e.renormalise, e.scoring, e.groups, \
            e.scaling
        self.router = Linear(d_model, e.count, bias=e.router_bias)
        self.correction = nn.Parameter(torch.zeros(e.count)) if e.correction_bias else None  # (E,)
        self.experts = nn.ModuleList(e.expert(d_model, d_ff) for _ in range(e.count))
        self.shared = SwiGLU(d_model, e.shared_d_ff) if e.shared_d_ff else None
        self.shared_gate = Linear(d_model, 1, bias=False) if e.shared_d_ff and e.shared_gate else None

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        B, T, d = x.shape
        x = x.reshape(B * T, d)                                     # (N, d): each token routed alone
        scores = self.router(x)                                     # (N, E)
        tap("router", scores)
        weights, chosen = self.route(scores)                        # (N, k) each
        tap("chosen_experts", chosen)
        out = mix_experts(x, self.experts, weights, chosen)         # (N, d)
        if self.shared is not None:
            out = out + self.shared_out(x)                          # (N, d): every token
        return out.view(B, T, d)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits (N, E) → the chosen experts' weights and indices, (N, k) each, in float32."""
        if self.scoring == "softmax":
            probs = F.softmax(logits.float(), dim=-1)               # (N, E), in float32 as HF does
            weights, chosen = probs.topk(self.top_k, dim=-1)
        else:
            probs = torch.sigmoid(logits.float())                   # (N, E): each expert scored alone
            choice = probs if self.correction is None else probs + self.correction.float()
            n, keep = self.groups
            if n > 1:                                               # the best groups by their two best scores
                group = choice.view(len(choice), n, -1).topk(2, dim=-1).values.sum(-1)  # (N, n)
                kept = torch.zeros_like(group).scatter_(1, group.topk(keep, dim=-1).indices, 1.0)
                choice = choice.masked_fill(~kept.bool().repeat_interleave(choice.size(1) // n, 1), float("-inf"))
            chosen = choice.topk(self.top_k, dim=-1).indices
            weights = probs.gather(1, chosen)                       # the scores, without the bias
        if self.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if self.scoring == "sigmoid" else 0.0))
        return weights * self.scale if self.scale != 1.0 else weights, chosen

    def shared_out(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert's output, × sigmoid(shared_gate(x)) where it has a gate: (N, d) → (N, d)."""
        return self.shared(x) if self.shared_gate is None else self.gated_shared(x)

    def gated_shared(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert's output × sigmoid(shared_gate(x)): (N, d) → (N, d)."""
        return torch.sigmoid(self.shared_gate(x)) * self.shared(x)
