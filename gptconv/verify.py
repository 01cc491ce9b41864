"""Parity: our model against a reference, step by step, to tolerances stated once per dtype."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn


@dataclass(frozen=True)
class Tolerance:
    """A step passes when max|ours − ref| ≤ atol + rtol · max|ref| of that step."""

    atol: float
    rtol: float
    min_top1: float  # fraction of positions whose argmax must agree

    def allowed(self, ref: torch.Tensor) -> float:
        return self.atol + self.rtol * abs_max(ref)


# Our model in this dtype against transformers in fp32. The only place tolerances are set.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-4, rtol=1e-5, min_top1=1.0),
    torch.float16: Tolerance(atol=5e-2, rtol=1e-2, min_top1=0.95),
    torch.bfloat16: Tolerance(atol=1e-1, rtol=4e-2, min_top1=0.90),
}


@dataclass
class StepDiff:
    name: str
    max_abs_diff: float
    allowed: float
    passed: bool


@dataclass
class Report:
    source: str
    reference: str
    dtype: str
    tolerance: dict
    inputs: dict[str, int]  # input name → length
    steps: list[StepDiff] = field(default_factory=list)
    max_abs_diff: float = 0.0  # at the logits
    top1_agreement: float = 1.0
    kl_mean: float = 0.0
    kl_max: float = 0.0
    first_divergent_step: str | None = None
    passed: bool = False

    def to_dict(self) -> dict:
        """As plain JSON values: an infinite or NaN difference becomes the string "inf" / "nan"."""
        return _json_safe(asdict(self))


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


@torch.no_grad()
def our_steps(model: nn.Module, ids: torch.Tensor, wanted: set[str]) -> dict[str, torch.Tensor]:
    steps: dict[str, torch.Tensor] = {}

    def tap(name: str, x: torch.Tensor) -> None:
        if name in wanted:
            steps[name] = x.detach().float()
    model(ids, tap=tap)
    return steps


ROWS = 8  # positions compared at a time, in buffers made once per comparison: the differences and the
          # float64 KL of a (1024, 128k) logits tensor would take several GB whole, and chunks allocated
          # anew each time grew the heap by 0.5 GB (GPT-2 124M; glibc keeps them past its mmap threshold)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def abs_max(t: torch.Tensor) -> float:
    """max|t|; NaN counts as infinite."""
    return _worst(x.abs().amax(-1) for x in _rows(t).split(ROWS))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a − b|; a NaN on either side counts as an infinite difference."""
    a, b = _rows(a), _rows(b)
    buf = torch.empty(min(ROWS, a.shape[0]), a.shape[-1], dtype=torch.promote_types(a.dtype, b.dtype))
    return _worst(torch.sub(x, y, out=buf[: x.shape[0]]).abs_().amax(-1) for x, y in zip(a.split(ROWS), b.split(ROWS)))


def _worst(maxima) -> float:
    worst = 0.0
    for m in maxima:
        if m.isnan().any():
            return float("inf")
        worst = max(worst, m.max().item())
    return worst


def kl_per_position(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p_ref ‖ p_ours) in nats at each position, in float64."""
    ref_rows, rows = _rows(ref_logits), _rows(logits)
    shape = (min(ROWS, rows.shape[0]), rows.shape[-1])
    ref_lp, lp = torch.empty(shape, dtype=torch.float64), torch.empty(shape, dtype=torch.float64)
    out = []
    for r, o in zip(ref_rows.split(ROWS), rows.split(ROWS)):
        n = r.shape[0]
        torch.log_softmax(ref_lp[:n].copy_(r), dim=-1, out=ref_lp[:n])
        torch.log_softmax(lp[:n].copy_(o), dim=-1, out=lp[:n])
        diff = lp[:n].neg_().add_(ref_lp[:n])  # log p_ref − log p_ours
        out.append(ref_lp[:n].exp_().mul_(diff).sum(-1))
    return torch.cat(out)


Reference = Callable[[str, torch.Tensor], dict[str, torch.Tensor]]  # (input name, ids) → step → tensor


def compare(model: nn.Module, inputs: dict[str, torch.Tensor], reference: Reference, source: str,
            reference_name: str) -> Report:
    """Run the reference and ``model`` on each input in turn and compare every step the reference
    records; only one input's steps are held at a time."""
    dtype = next(model.parameters()).dtype
    tol = TOLERANCES[dtype]
    report = Report(source, reference_name, str(dtype).removeprefix("torch."), asdict(tol),
                    {name: ids.shape[1] for name, ids in inputs.items()})
    worst: dict[str, StepDiff] = {}
    agree = total = 0
    kls = []
    for name, ids in inputs.items():
        ref = reference(name, ids)
        ours = our_steps(model, ids, set(ref))
        for step, ref_t in ref.items():
            if step not in ours:
                raise ValueError(f"the reference has step '{step}', which our model does not compute")
            diff = max_abs_diff(ours[step], ref_t)
            allowed = tol.allowed(ref_t)
            prev = worst.get(step)
            if prev is None or diff - allowed > prev.max_abs_diff - prev.allowed:
                worst[step] = StepDiff(step, diff, allowed, diff <= allowed)
        agree += (ours["logits"].argmax(-1) == ref["logits"].argmax(-1)).sum().item()
        total += ref["logits"][..., 0].numel()
        kls.append(kl_per_position(ref["logits"], ours["logits"]))
        order = list(ours)  # the trace order
        del ref, ours
    report.steps = sorted(worst.values(), key=lambda s: order.index(s.name))
    report.max_abs_diff = worst["logits"].max_abs_diff
    report.top1_agreement = agree / total
    kl = torch.cat(kls)
    report.kl_mean, report.kl_max = kl.mean().item(), kl.max().item()
    report.first_divergent_step = next((s.name for s in report.steps if not s.passed), None)
    report.passed = report.first_divergent_step is None and report.top1_agreement >= tol.min_top1
    return report
