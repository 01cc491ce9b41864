"""Parity: our model against a reference, step by step, to tolerances stated once per dtype."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn

from .errors import GptconvError
from .models.linear import one_row_product
from .results import Result


# The inputs both sides run: the fixed prompts (when the checkpoint has a tokenizer) and seeded random ids.
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Ünïcödé, emoji 🙂 and digits 1234567890 — all in one line.",
)


def parity_inputs(tokenizer: object | None, vocab_size: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The fixed inputs: each prompt tokenized (when there is a tokenizer) and seeded random ids (1, length)."""
    inputs = {}
    if tokenizer is not None:
        for n, text in enumerate(PROMPTS):
            ids = [i for i in tokenizer.encode(text) if i < vocab_size][:length]
            if ids:
                inputs[f"prompt{n}"] = torch.tensor([ids])
    g = torch.Generator().manual_seed(seed)
    inputs["random"] = torch.randint(0, vocab_size, (1, length), generator=g)
    return inputs



@dataclass(frozen=True)
class Tolerance:
    """A step passes when max|ours − ref| ≤ atol + rtol · max|ref| of that step."""

    atol: float
    rtol: float
    min_top1: float  # fraction of positions whose argmax must agree

    def allowed(self, ref: torch.Tensor) -> float:
        return self.atol + self.rtol * abs_max(ref)


# The only place tolerances are set.
# Our float32 model against transformers in float32: the two differ by summation order only.
FP32 = Tolerance(atol=1e-4, rtol=1e-5, min_top1=1.0)
# Our float32 model against llama.cpp's float32 path on the same (dequantized) weights, by architecture.
# llama.cpp has approximations of its own: its vectorised exp (softmax, SiLU) and, for GPT-2, GELU read
# from a float16 table (input and output rounded to float16: ~1e-3 relative). Measured max|Δ|:
# Llama-family 3e-6 … 1e-4 (SmolLM2 3.8e-5); GPT-2 5e-4 (124M) … 3.1e-3 (random, max|logit| 6.5).
LLAMA_CPP = {
    "llama": Tolerance(atol=5e-4, rtol=5e-5, min_top1=0.99),
    "gpt2": Tolerance(atol=1e-3, rtol=1e-3, min_top1=0.99),
    # Gemma 3: its GeGLU's GELU also from ggml's float16 table (emulating that rounding takes a random
    # model's 3.8e-3 at max|logit| 9.2 down to 1.6e-3)
    "gemma3": Tolerance(atol=1e-3, rtol=1e-3, min_top1=0.99),
}
# Our model against itself computed in another order: through the KV cache in chunks, the head on the
# last row only, the one-row products (BLAS gemv or blocks) against F.linear. float32 summation order.
SAME_MODEL = Tolerance(atol=1e-5, rtol=1e-5, min_top1=1.0)
# A narrowed GGUF (f16, q8_0) run by llama.cpp against our float32 model: a quality bar, not parity
# (issue 4); measured on SmolLM2 f16 100 %, q8_0 94.3 % (its 8-bit activations; the suite's xfail).
QUANTIZED_MIN_TOP1 = 0.95
# float16 / bfloat16 are judged against the reference's own error at that precision, not against a
# fixed bound: trained weights drive activations to ~2e4, where one bfloat16 ulp is 128, so any
# fixed tolerance either fails a correct model or passes a broken one. The reference runs in
# float32 and in the dtype; ours in the dtype passes when its distance from the float32 reference
# is at most LOW_PRECISION_FACTOR times the reference's own: per step in root-mean-square error
# (max|Δ| is set by a few rounding outliers: its ratio reached 3.6 on a correct SmolLM2 where the
# RMS ratio stays within 0.83 … 1.05), in top-1 disagreements (plus TOP1_GRACE positions of count
# noise) and in mean KL (plus KL_FLOOR). Measured on correct models (note on issue 10): RMS ratios
# 0.83 … 1.05, top-1 disagreement ratios 0.92 (bf16) and 1.36 (fp16); SmolLM2 with RoPE theta 1e4
# for 1e5 at bf16: RMS ratios 9 … 70, top-1 disagreement ratio 7.7.
LOW_PRECISION_FACTOR = 2.0
TOP1_GRACE = 2  # positions
KL_FLOOR = 1e-6  # nats: below this two distributions are the same for any use


@dataclass
class StepDiff:
    """One step, ours against the float32 reference. In float32 ``allowed`` bounds max|Δ|; in float16 /
    bfloat16 it bounds the RMS difference, from the reference's own RMS difference at that dtype."""

    name: str
    max_abs_diff: float
    allowed: float
    passed: bool
    rms_diff: float | None = None
    reference_own_rms: float | None = None


@dataclass
class Report(Result):
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
    reference_own: dict | None = None  # low precision: the reference's own top-1 and KL at our dtype
    first_divergent_step: str | None = None
    passed: bool = False
    notes: list[str] = field(default_factory=list)
    one_row_product: str = field(default_factory=one_row_product)  # our one-token linear (models/linear.py)


@torch.no_grad()
def our_steps(model: nn.Module, ids: torch.Tensor, wanted: set[str]) -> dict[str, torch.Tensor]:
    steps: dict[str, torch.Tensor] = {}

    def tap(name: str, x: torch.Tensor) -> None:
        if name in wanted:
            steps[name] = x.detach().float().cpu()  # compared on the CPU, whatever the model runs on
    model(ids.to(next(model.parameters()).device), tap=tap)
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


def sum_sq_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Σ(a − b)² in float64 (``b`` may be a scalar); a NaN on either side counts as infinite."""
    a = _rows(a)
    b = _rows(b.expand(a.shape) if b.dim() == 0 else b)
    buf = torch.empty(min(ROWS, a.shape[0]), a.shape[-1], dtype=torch.float64)
    total = 0.0
    for x, y in zip(a.split(ROWS), b.split(ROWS)):
        d = buf[: x.shape[0]].copy_(x).sub_(y)
        total += d.mul_(d).sum().item()
    return total if not math.isnan(total) else math.inf


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
            reference_name: str, tolerance: Tolerance = FP32, reference_at_dtype: Reference | None = None,
            on_input: Callable[[int, int], None] = lambda done, total: None) -> Report:
    """Run the reference and ``model`` on each input in turn and compare every step the reference
    records; only one input's steps are held at a time.

    ``reference`` gives float32 steps. A float16 / bfloat16 model also needs ``reference_at_dtype``,
    the same reference run in that dtype, to measure the reference's own error (see
    ``LOW_PRECISION_FACTOR``). A NaN or Inf on either side fails its step, whatever the tolerance.
    """
    dtype = next(model.parameters()).dtype
    low = dtype != torch.float32
    if low and reference_at_dtype is None:
        raise ValueError(f"a {dtype} verdict needs the reference's own run in that dtype")
    tol = asdict(tolerance) | ({"low_precision_factor": LOW_PRECISION_FACTOR, "top1_grace": TOP1_GRACE,
                                "kl_floor": KL_FLOOR} if low else {})
    report = Report(source, reference_name, str(dtype).removeprefix("torch."), tol,
                    {name: ids.shape[1] for name, ids in inputs.items()})
    worst: dict[str, StepDiff] = {}
    squares: dict[str, list[float]] = {}  # low precision: step → [Σ(ours − ref)², Σ(own − ref)², Σref², count]
    agree = own_agree = total = 0
    kls, own_kls = [], []
    order: list[str] = []
    for name, ids in inputs.items():
        ref = reference(name, ids)
        own = reference_at_dtype(name, ids) if low else None
        ours = our_steps(model, ids, set(ref))
        for step, ref_t in ref.items():
            if step not in ours:
                raise ValueError(f"the reference has step '{step}', which our model does not compute")
            diff = max_abs_diff(ours[step], ref_t)
            if low:
                acc = squares.setdefault(step, [0.0, 0.0, 0.0, 0])
                acc[0] += sum_sq_diff(ours[step], ref_t)
                acc[1] += sum_sq_diff(own[step], ref_t)
                acc[2] += sum_sq_diff(ref_t, torch.zeros(()))
                acc[3] += ref_t.numel()
                prev = worst.get(step)
                worst[step] = StepDiff(step, max(diff, prev.max_abs_diff) if prev else diff, math.inf, False)
                continue
            allowed = tolerance.allowed(ref_t)
            passed = math.isfinite(diff) and diff <= allowed
            prev = worst.get(step)
            if prev is None or (prev.passed and not passed) or (
                    prev.passed == passed and diff - allowed > prev.max_abs_diff - prev.allowed):
                worst[step] = StepDiff(step, diff, allowed, passed)
        top = ref["logits"].argmax(-1)
        agree += (ours["logits"].argmax(-1) == top).sum().item()
        total += top.numel()
        kls.append(kl_per_position(ref["logits"], ours["logits"]))
        if low:
            own_agree += (own["logits"].argmax(-1) == top).sum().item()
            own_kls.append(kl_per_position(ref["logits"], own["logits"]))
        order = list(ours)  # the trace order
        del ref, ours, own
        on_input(len(kls), len(inputs))
    for step, (ours_sq, own_sq, ref_sq, count) in squares.items():
        if not math.isfinite(own_sq):
            raise GptconvError(f"{source}: the reference's own {report.dtype} run holds NaN or Inf at '{step}', so "
                               f"there is no {report.dtype} error to judge ours by; verify in another dtype")
        s = worst[step]
        s.rms_diff, s.reference_own_rms = math.sqrt(ours_sq / count), math.sqrt(own_sq / count)
        s.allowed = LOW_PRECISION_FACTOR * s.reference_own_rms + tolerance.atol + tolerance.rtol * math.sqrt(ref_sq / count)
        s.passed = math.isfinite(s.max_abs_diff) and s.rms_diff <= s.allowed
    report.steps = sorted(worst.values(), key=lambda s: order.index(s.name))
    report.max_abs_diff = worst["logits"].max_abs_diff
    report.top1_agreement = agree / total
    kl = torch.cat(kls)
    report.kl_mean, report.kl_max = _finite_or_inf(kl.mean()), _finite_or_inf(kl.max())
    report.first_divergent_step = next((s.name for s in report.steps if not s.passed), None)
    if any(not math.isfinite(s.max_abs_diff) for s in report.steps):
        report.notes.append("NaN or Inf values: a step that holds them fails whatever the tolerance")
    if low:
        own_kl = torch.cat(own_kls)
        report.reference_own = {"top1_agreement": own_agree / total, "kl_mean": _finite_or_inf(own_kl.mean()),
                                "kl_max": _finite_or_inf(own_kl.max())}
        top1_ok = total - agree <= LOW_PRECISION_FACTOR * (total - own_agree) + TOP1_GRACE
        kl_ok = report.kl_mean <= LOW_PRECISION_FACTOR * report.reference_own["kl_mean"] + KL_FLOOR
        if not kl_ok:
            report.notes.append(f"mean KL above {LOW_PRECISION_FACTOR:g}× the reference's own")
        if not top1_ok:
            report.notes.append(f"top-1 disagreements above {LOW_PRECISION_FACTOR:g}× the reference's own")
    else:
        top1_ok, kl_ok = report.top1_agreement >= tolerance.min_top1, True
        if not top1_ok:
            report.notes.append("top-1 agreement below the tolerance")
    report.passed = report.first_divergent_step is None and top1_ok and kl_ok
    return report


def _finite_or_inf(t: torch.Tensor) -> float:
    """A KL statistic; NaN (a NaN logit) counts as infinite."""
    value = t.item()
    return value if not math.isnan(value) else math.inf
