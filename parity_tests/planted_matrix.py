"""The planted-bug catalog's verdict matrix, as Markdown (printed by the suite, kept in the README)."""

from __future__ import annotations


def matrix(rows: list[dict]) -> str:
    bugs = sorted((r for r in rows if r["kind"] == "bug"), key=lambda r: r["order"])
    correct = [r for r in rows if r["kind"] == "correct"]
    families = list(dict.fromkeys(r["family"] for r in bugs))
    names = [n for _, n in sorted({(r["order"][1], r["bug"]) for r in bugs})]
    out = ["| bug | " + " | ".join(families) + " |", "|---|" + "---|" * len(families)]
    for name in names:
        cells = []
        for family in families:
            here = {r["dtype"]: r for r in bugs if r["bug"] == name and r["family"] == family}
            cells.append(" / ".join(_cell(here[d]) for d in ("float32", "bfloat16") if d in here) or "—")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    lines = ["\n".join(out), "cells: float32 / bfloat16 — FAILED (caught, at the step named), PASSED (missed), "
             "'below' (the bug's exact effect is smaller than bfloat16's own rounding everywhere); — : cannot exist there"]
    for dtype in ("float32", "bfloat16"):
        here = [r for r in bugs if r["dtype"] == dtype]
        visible = [r for r in here if not r["below_resolution"]]
        caught = sum(r["caught"] and r["step"] == r["expected"] for r in visible)
        below = len(here) - len(visible)
        lines.append(f"{dtype}: caught {caught} / {len(visible)} planted" +
                     (f" ({below} more below its resolution, of which {sum(r['caught'] for r in here if r['below_resolution'])} "
                      "caught anyway)" if below else ""))
    lines.append("")
    lines.append("| family | correct: largest RMS ratio f32 / bf16 / f16 | planted, caught: smallest RMS ratio where it failed f32 / bf16 |")
    lines.append("|---|---|---|")
    for family in families:
        ok = [max((r["worst_ratio"] for r in correct if r["family"] == family and r["dtype"] == d), default=None)
              for d in ("float32", "bfloat16", "float16")]
        bad = [min((r["seen_ratio"] for r in bugs if r["family"] == family and r["dtype"] == d and r["caught"]
                    and r["seen_ratio"] is not None), default=None) for d in ("float32", "bfloat16")]
        lines.append(f"| {family} | {' / '.join(_num(x) for x in ok)} | {' / '.join(_num(x) for x in bad)} |")
    if correct:
        false = [r for r in correct if not r["passed"]]
        worst = max(r["worst_ratio"] for r in correct)
        lines.append(f"correct models: {len(correct) - len(false)} / {len(correct)} PASSED, false FAILED: {len(false)} "
                     f"(largest RMS ratio to the reference's own error: {worst:.2f})")
    return "\n".join(lines)


def _cell(r: dict) -> str:
    if r["below_resolution"]:
        return "below" + (" (caught)" if r["caught"] else "")
    if not r["caught"]:
        return "**PASSED**"
    return "FAILED" if r["step"] == r["expected"] else f"FAILED at {r['step']}"


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"
