"""The MoE layer with its expert mixing (``layers.mlp.mix_experts``) against the loop that function was
first (a scan of the choice table per expert, every expert visited), measured in the same run.

    python -m gptconv.bench.moe [--d-model 512] [--d-ff 256] [--experts 64] [--top-k 8]
                                [--tokens 1,16,128,512] [--steps 64] [--rounds 7] [--device cpu]

One MoE layer with random weights, its whole forward (router included), in float32 and bfloat16: prefill
(one call on T tokens) and decode (one token a call, a new token each step, so the chosen experts change).
The two mixings take turns, round after round, on the same inputs; the table gives each one's median ms a
call (a token, for decode), their ratio (new ÷ old), and whether their outputs are the same to the bit (a
row where they are not stops the run).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
import torch
import torch.nn as nn

from ..devices import parse_device
from ..layers import mlp
from ..layers.mlp import Experts, MoE


def scan_per_expert(x: torch.Tensor, experts: nn.ModuleList, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """mix_experts as it was first, kept as the reference: for each expert, a scan of chosen (N, k) for its
    tokens; x (N, d)."""
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)          # the tokens that chose expert e
        if token.numel():
            out.index_add_(0, token, (expert(x[token]) * weights[token, slot, None]).to(x.dtype))
    return out


MIXINGS = {"old": scan_per_expert, "new": mlp.mix_experts}


@contextmanager
def mixing(mix: Callable) -> Iterator[None]:
    """MoE.forward with ``mix`` as its mix_experts, for the duration."""
    kept = mlp.mix_experts
    mlp.mix_experts = mix
    try:
        yield
    finally:
        mlp.mix_experts = kept


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call_ms(layer: MoE, inputs: list[torch.Tensor], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for x in inputs:
        layer(x)
    synchronize(device)
    return (time.perf_counter() - start) / len(inputs) * 1e3


def compare(layer: MoE, inputs: list[torch.Tensor], rounds: int, device: torch.device) -> dict:
    """Each mixing's median ms a call over ``rounds`` turns, and whether their outputs are the same bits."""
    outs, times = {}, {name: [] for name in MIXINGS}
    for name, mix in MIXINGS.items():  # the outputs, and a first call (warm-up) on each input
        with mixing(mix):
            outs[name] = [layer(x) for x in inputs]
    for _ in range(rounds):
        for name, mix in MIXINGS.items():
            with mixing(mix):
                times[name].append(per_call_ms(layer, inputs, device))
    old, new = (statistics.median(times[name]) for name in MIXINGS)
    same = all(torch.equal(a, b) for a, b in zip(outs["old"], outs["new"]))
    return {"old": old, "new": new, "ratio": new / old, "same": same}


def bench(d_model: int, d_ff: int, n_experts: int, top_k: int, tokens: list[int], steps: int, rounds: int,
          device: torch.device, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)) -> list[dict]:
    """The rows: per dtype, prefill at each T (calls enough for ~256 tokens a round) and decode over ``steps``."""
    rows = []
    for dtype in dtypes:
        layer = MoE(d_model, d_ff, Experts(n_experts, top_k)).to(device, dtype).eval()
        g = torch.Generator().manual_seed(0)
        cases = [(f"prefill T={t}", [torch.randn(1, t, d_model, generator=g)] * max(2, 256 // t)) for t in tokens]
        cases.append((f"decode T=1, {steps} steps", [torch.randn(1, 1, d_model, generator=g) for _ in range(steps)]))
        for case, inputs in cases:
            with torch.inference_mode():
                r = compare(layer, [x.to(device, dtype) for x in inputs], rounds, device)
            if not r["same"]:
                raise click.ClickException(f"{case} {dtype}: the grouped mixing's output differs from the scan's")
            rows.append({"case": case, "dtype": str(dtype).removeprefix("torch."), **r})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| case | dtype | old ms | new ms | ratio | same bits |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['dtype']} | {r['old']:.3g} | {r['new']:.3g} | {r['ratio']:.2f} | "
                     f"{'yes' if r['same'] else '**no**'} |")
    return "\n".join(lines)


@click.command()
@click.option("--d-model", default=512, show_default=True, type=click.IntRange(1))
@click.option("--d-ff", default=256, show_default=True, type=click.IntRange(1), help="Each expert's.")
@click.option("--experts", "n_experts", default=64, show_default=True, type=click.IntRange(1))
@click.option("--top-k", default=8, show_default=True, type=click.IntRange(1))
@click.option("--tokens", default="1,16,128,512", show_default=True, help="Prefill lengths, comma-separated.")
@click.option("--steps", default=64, show_default=True, type=click.IntRange(1), help="Decode steps.")
@click.option("--rounds", default=7, show_default=True, type=click.IntRange(1))
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:N or auto.")
def main(d_model: int, d_ff: int, n_experts: int, top_k: int, tokens: str, steps: int, rounds: int,
         device: str) -> None:
    if top_k > n_experts:
        raise click.BadParameter(f"{top_k} of {n_experts} experts", param_hint="--top-k")
    where = parse_device(device)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    click.echo(f"machine: {cpu}, {os.cpu_count()} cores; torch "
               f"{torch.__version__} ({torch.get_num_threads()} threads), {where}; MoE d_model {d_model}, "
               f"d_ff {d_ff}, {n_experts} experts, top {top_k}")
    rows = bench(d_model, d_ff, n_experts, top_k, [int(t) for t in tokens.split(",") if t], steps, rounds, where)
    click.echo(table(rows))


if __name__ == "__main__":
    main()
