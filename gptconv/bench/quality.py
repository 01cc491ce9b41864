"""What each GGUF type costs a model, measured as llama.cpp users read it: for every export type, the
file's size and bits per weight, the export's time, and its perplexity on a text with KL divergence
and top-1 agreement against the model's f32 export (``gptconv perplexity --against``).

    python -m gptconv.bench.quality SOURCE TEXTFILE [--ctx 128] [--types q8_0,q4_k_m] [--llama-cpp]

``--llama-cpp`` adds the same figures with each file run by llama.cpp as stored (``--in llama.cpp``:
its quantized kernels, which also round activations), against the f32 export run here.

Prints a Markdown table (the README's).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ..api import perplexity
from ..loader import open_source
from ..writers import export

TYPES = ["f32", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q5_k_s", "q5_1", "q5_0", "q4_k_m", "q4_k_s", "q4_1",
         "q4_0", "q3_k_l", "q3_k_m", "q3_k_s", "q2_k"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source")
    p.add_argument("text", type=Path)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--llama-cpp", action="store_true", help="also run each file in llama.cpp")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = export(args.source, Path(tmp) / "base.f32.gguf", "gguf", "f32").out
        n_weights = sum(_numel(t.shape) for t in open_source(base).tensors.values())
        for dtype in args.types.split(","):
            out = Path(tmp) / f"{dtype}.gguf"
            start = time.perf_counter()
            export(str(base), out, "gguf", dtype)
            seconds = time.perf_counter() - start
            r = perplexity(out, args.text, ctx=args.ctx, against=base)
            a = r.against
            size = out.stat().st_size
            row = (f"| {dtype} | {size / 2**20:.1f} MiB | {8 * size / n_weights:.2f} | {seconds:.1f} s | "
                   f"{r.perplexity:.4f} | {a.delta_perplexity:+.4f} | {a.kl_mean:.5f} | {a.kl_p99:.5f} | "
                   f"{a.same_top:.2%} |")
            if args.llama_cpp:
                r = perplexity(out, args.text, ctx=args.ctx, against=base, engine="llama.cpp")
                a = r.against
                row += f" {r.perplexity:.4f} | {a.kl_mean:.5f} | {a.same_top:.2%} |"
            rows.append(row)
            out.unlink()
    print(f"{args.source} on {args.text.name}, windows of {args.ctx} tokens; against its f32 export\n")
    head = "| type | file | bits/weight | export | perplexity | Δppl | KLD mean | KLD p99 | same top |"
    if args.llama_cpp:
        head += " in llama.cpp: perplexity | KLD mean | same top |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    print("\n".join(rows))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    main()
