"""mix_experts against the scan per expert it was first (kept as ``gptconv.bench.moe.scan_per_expert``,
the benchmark's baseline): the same bits, in float32 and bfloat16, whichever experts the tokens choose,
and whole MoE layers with it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gptconv.bench.moe import mixing, scan_per_expert
from gptconv.layers.mlp import Experts, GeGLU, MoE, SwiGLU, mix_experts

E, D, D_FF = 64, 37, 19  # an odd width: rows of x that do not start on the allocator's alignment round differently


def routed(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and choices (N, k) as a router makes them (k distinct experts a token, softmax weights
    renormalised), with a quarter of the experts chosen by no token."""
    scores = torch.randn(n, E, generator=g)
    scores[:, torch.randperm(E, generator=g)[:E // 4]] = -torch.inf
    weights, chosen = scores.softmax(-1).topk(k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), chosen


@pytest.mark.parametrize("expert", [SwiGLU, GeGLU])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 7, 64, 300])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_grouped_mixing_is_the_scan_to_the_bit(expert, dtype, n, k):
    torch.manual_seed(n * 10 + k)
    experts = nn.ModuleList(expert(D, D_FF) for _ in range(E)).to(dtype)
    g = torch.Generator().manual_seed(n * 10 + k)
    weights, chosen = routed(n, k, g)
    x = torch.randn(n, D, generator=g).to(dtype)
    assert (torch.bincount(chosen.reshape(-1), minlength=E) == 0).any()  # some experts have no token
    with torch.no_grad():
        got, want = mix_experts(x, experts, weights, chosen), scan_per_expert(x, experts, weights, chosen)
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared_d_ff", [0, 32])
@pytest.mark.parametrize("T", [1, 5, 130])
def test_moe_layer_is_the_same_bits(dtype, shared_d_ff, T):
    """The whole layer (router, top-k, mixing, shared expert), as the models call it."""
    torch.manual_seed(T)
    layer = MoE(D, D_FF, Experts(E, 8, shared_d_ff=shared_d_ff)).to(dtype).eval()
    x = torch.randn(2, T, D).to(dtype)
    with torch.inference_mode():
        got = layer(x)
        with mixing(scan_per_expert):
            want = layer(x)
    assert torch.equal(got, want)
