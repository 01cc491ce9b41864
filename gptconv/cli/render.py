"""How the CLI prints each result: plain, aligned text for a terminal."""

from __future__ import annotations

import re

import click

from ..families import family_of
from ..tracing import explain


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def pull_summary(s) -> None:
    click.echo(f"source        {s.source}" + (f"  (Hub repo {s.repo_id})" if s.repo_id else ""))
    click.echo(f"architecture  {s.arch}" + (f" (the {s.family} family)" if s.family and s.family != s.arch else ""))
    click.echo(f"parameters    {s.parameters:,}")
    click.echo("dtype         " + ", ".join(f"{d} ({n} tensors)" for d, n in s.dtypes.items()))
    click.echo(f"context       {s.context_length:,} positions")
    click.echo(f"key layout    {s.layout}: every tensor mapped once, every parameter filled, shapes checked")
    if s.left_out:
        click.echo(f"left out      {len(s.left_out)} tensors of {s.left_out_what}: the text model of a '{s.wrapper}' "
                   "checkpoint is what loads")
    if s.dropped:
        shown = ", ".join(s.dropped[:3]) + (f", … ({len(s.dropped) - 3} more)" if len(s.dropped) > 3 else "")
        click.echo(f"dropped       {len(s.dropped)} tensors by named rules of the key table, unused by the trace: {shown}")
    if s.held:
        shown = ", ".join(s.held[:3]) + (f", … ({len(s.held) - 3} more)" if len(s.held) > 3 else "")
        click.echo(f"held          {len(s.held)} tensors of the multi-token-prediction layers (a draft head): loaded "
                   f"and written back on export, not run by the trace: {shown}")
    click.echo(f"folder        {s.folder}")
    for name, size in s.files:
        click.echo(f"  {name:<40} {_bytes(size):>10}")


def trace(result) -> None:
    cfg, steps = result.config, result.steps
    heads = f"{cfg.n_heads} heads" + (f" (K/V: {cfg.n_kv_heads})" if cfg.n_kv_heads != cfg.n_heads else "")
    family = family_of(cfg)
    click.echo(f"{family.name}: {cfg.n_layers} blocks, d = {cfg.d_model}, {heads}, head_dim = {cfg.head_dim}, "
               f"vocab = {cfg.vocab_size:,}")
    for line in family.describe(cfg):
        click.echo(line)
    w = max([24, *(len(st.name) + 1 for st in steps)])  # the step column fits the longest name
    click.echo(f"{'step':<{w}} {'shape':<20} {'mean':>10} {'std':>10} {'min':>10} {'max':>10}  what")
    explained = set()
    for st in steps:
        shape = "(" + ", ".join(str(d) for d in st.shape) + ")"
        kind = ".".join(p for p in st.name.split(".") if not p.isdigit())  # block.3.router → block.router
        note = "〃" if kind in explained else explain(st.name)
        explained.add(kind)
        click.echo(f"{st.name:<{w}} {shape:<20} {st.mean:>10.4f} {st.std:>10.4f} {st.min:>10.4f} {st.max:>10.4f}  {note}")
    click.echo("next token    " + "  ".join(f"{repr(w) if w is not None else i} {p:.3f}" for i, w, p in result.top))


def verify_report(r) -> None:
    tol = r.tolerance
    click.echo(f"verify {r.source} ({r.dtype}) against {r.reference}")
    click.echo("inputs: " + ", ".join(f"{n} ({t} tokens)" for n, t in r.inputs.items())
               + f"; one-row product setting: {r.one_row_product}")
    if tol.get("rule") == "fixed":
        click.echo(f"tolerance: max|Δ| ≤ {tol['atol']:g} + {tol['rtol']:g}·max|ref| per step; "
                   f"top-1 agreement ≥ {tol['min_top1']:.0%}")
        click.echo(f"{'step':<24} {'max|Δ|':>12} {'allowed':>12}")
        for s in r.steps:
            click.echo(f"{s.name:<24} {s.max_abs_diff:>12.3e} {s.allowed:>12.3e}  {'ok' if s.passed else 'FAIL'}")
    else:
        click.echo(f"tolerance: both against the reference in float64 (the truth); ours in {r.dtype} within "
                   f"{tol['factor']:g}× the reference's own {r.dtype} error: RMS per step (+ {tol['floor_rtol']:.2g}·RMS of "
                   f"the step), top-1 disagreements (+ {tol['top1_grace']}), mean KL (+ {tol['kl_floor']:g})")
        click.echo(f"{'step':<30} {'max|Δ|':>10} {'RMS Δ ours':>11} {'RMS Δ ref':>11} {'ratio':>6} {'allowed':>10}")
        for s in r.steps:
            ratio = "—" if s.ratio is None else f"{s.ratio:.2f}"
            rms = "—" if s.rms_diff is None else f"{s.rms_diff:.3e}"
            own = "—" if s.reference_own_rms is None else f"{s.reference_own_rms:.3e}"
            click.echo(f"{s.name:<30} {s.max_abs_diff:>10.3e} {rms:>11} {own:>11} {ratio:>6} {s.allowed:>10.3e}  "
                       f"{'ok' if s.passed else 'FAIL'}")
    click.echo(f"logits max|Δ| = {r.max_abs_diff:.3e}{' (from the truth)' if r.reference_own else ''}, top-1 agreement = {r.top1_agreement:.2%}, "
               f"KL mean = {r.kl_mean:.3e}, max = {r.kl_max:.3e}")
    if r.reference_own is not None:
        o = r.reference_own
        click.echo(f"the reference's own {r.dtype} run: top-1 agreement = {o['top1_agreement']:.2%}, "
                   f"KL mean = {o['kl_mean']:.3e}, max = {o['kl_max']:.3e}")
    for note in r.notes:
        click.echo(f"note: {note}")
    if r.passed:
        click.echo("PASSED")
    elif r.first_divergent_step:
        click.echo(f"FAILED: first divergent step: {r.first_divergent_step}")
    else:
        click.echo("FAILED: " + (r.notes[-1] if r.notes else "top-1 agreement below the tolerance"))


def inspection(result) -> None:
    click.echo(f"{result.path} ({result.kind}, {len(result.tensors)} tensors)")
    if result.config:
        click.echo("config: " + ", ".join(f"{k}={v}" for k, v in result.config.items() if not isinstance(v, (dict, list))))
    for k, v in result.metadata.items():
        click.echo(f"metadata {k} = {str(v)[:120]}")
    for t in result.tensors:
        click.echo(f"  {t.name:<56} {t.dtype:<9} {list(t.shape)}")


def export_summary(s) -> None:
    click.echo(f"exported {s.source} → {s.out} ({s.format}, {s.dtype})")
    for f in s.files:
        click.echo(f"  {f.name:<40} {f.bytes:>14,} bytes  sha256 {f.sha256}")
    click.echo(f"  total {sum(f.bytes for f in s.files):,} bytes")
    for note in s.notes:
        click.echo(f"  note: {note}")
    if s.tensor_choices:
        click.echo("  tensor types, and why:")
        groups: dict[tuple[str, str], list[str]] = {}
        for c in s.tensor_choices:  # blk.0.attn_v … blk.29.attn_v → blk.*.attn_v
            groups.setdefault((c.type, c.why), []).append(re.sub(r"^blk\.\d+\.", "blk.*.", c.tensor).removesuffix(".weight"))
        for (kind, why), names in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
            kinds = list(dict.fromkeys(names))
            shown = ", ".join(kinds[:4]) + (f", … ({len(kinds) - 4} more)" if len(kinds) > 4 else "")
            click.echo(f"    {kind:<5} × {len(names):<4} {shown} — {why}")


def perplexity(r) -> None:
    click.echo(f"{r.source} on {r.text}: {r.windows} windows of {r.ctx} tokens, {r.scored:,} tokens scored")
    click.echo(f"run by        {r.engine}")
    click.echo(f"perplexity    {r.perplexity:.4f}   (mean NLL {r.nll_mean:.6f} nats)")
    a = r.against
    if a is not None:
        click.echo(f"base          {a.base}: perplexity {a.base_perplexity:.4f}, Δppl {a.delta_perplexity:+.4f}")
        click.echo(f"KL(base‖this) mean {a.kl_mean:.6f}  median {a.kl_median:.6f}  p99 {a.kl_p99:.6f}  "
                   f"max {a.kl_max:.6f}")
        click.echo(f"same top      {a.same_top:.2%}")
