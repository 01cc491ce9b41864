"""The trace: every named step of the forward pass, in order, with its shape and statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from .streaming import model_device


@dataclass(frozen=True)
class StepStats:
    """One traced step: its name, shape and statistics (the forward's own state is ``layers.step.Step``)."""

    name: str
    shape: tuple[int, ...]
    mean: float
    std: float
    min: float
    max: float


def _step(name: str, x: torch.Tensor) -> StepStats:
    x = x.detach().float()
    return StepStats(name, tuple(x.shape), x.mean().item(), x.std(correction=0).item(), x.min().item(), x.max().item())


@torch.no_grad()
def trace_steps(model: nn.Module, ids: torch.Tensor) -> tuple[list[StepStats], torch.Tensor]:
    """Run ``model`` on ids (B, T); return its steps (ids first, logits last) and the logits."""
    steps = [_step("ids", ids)]
    logits = model(ids.to(model_device(model)), tap=lambda name, x: steps.append(_step(name, x)))
    return steps, logits


# What each step is, for a reader of the trace (block steps share one line).
EXPLAIN = {
    "ids": "token ids from the tokenizer",
    "token_embedding": "tok_emb[ids]: one d-vector per token",
    "position_embedding": "+ wpe[0:T]: where each token is (GPT-2 only)",
    "embedding_dropout": "dropout (identity in eval mode)",
    "block": "x + mix(x), then x + mlp(x), each sublayer normed as the header says; mix is the only step "
             "mixing positions: attention, or in the layers the header names a recurrent layer",
    "final_norm": "final norm of the residual stream before the head",
    "logits": "LM head: one score per vocabulary entry at each position",
}
# Steps inside a block (block.{i}.<step>), where the architecture has them.
EXPLAIN_INSIDE = {
    "q_norm": "RMSNorm of the queries before RoPE (each head, or the whole projection: see the header)",
    "k_norm": "RMSNorm of the keys before RoPE (each head, or the whole projection: see the header)",
    "router": "router scores: one per expert for each token",
    "chosen_experts": "the experts each token goes to: the top-k router probabilities",
    "post_attention_norm": "norm of the attention output before the residual add",
    "post_feedforward_norm": "norm of the MLP output before the residual add",
    "attention_gate": "attention's heads × sigmoid(gate(x)), before the output projection",
    "conv": "linear attention: q, k, v through a short causal convolution (its last inputs kept in the state), SiLU",
    "linear_attention": "gated delta rule: each value head reads q from its state S, after S ← e^g·S + k ⊗ β(v − Sᵀk)",
    "gated_norm": "RMSNorm of each head's output × SiLU(z), before the output projection",
    "short_conv": "gated short convolution: B ⊙ x through a depthwise causal convolution over the last few positions "
                  "(its last inputs kept in the state), before × C and the output projection",
}


def explain(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "block":
        return EXPLAIN_INSIDE.get(parts[2], "")
    return EXPLAIN.get(parts[0], "")
