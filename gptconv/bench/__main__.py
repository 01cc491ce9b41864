"""``python -m gptconv.bench [--models gpt2-124m,smollm2-135m] [--repeat 3] [--scale] [--json FILE]``

Prints, per case and model, gptconv's median beside its peer's median from the same run, their
ratio, and the target; ``--scale`` adds the synthetic Llama-3-8B (made once, ~16 GB, in the bench
folder: ``--dir`` or ``$GPTCONV_BENCH_DIR``, default ``~/.cache/gptconv-bench``).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from .checkpoints import converter_ready, ensure, llama_cpp_source

MB = 10**6


@dataclass
class Row:
    case: str
    model: str
    ours: float
    peer: float | None
    unit: str
    ratio: float | None
    target: str
    met: bool | None
    note: str = ""


def work(case: str, peer: str, folder: Path, **opts) -> dict:
    """Run one measurement in a fresh worker process and return what it reported."""
    cmd = [sys.executable, "-m", "gptconv.bench.worker", case, peer, str(folder), json.dumps(opts)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if r.returncode != 0:
        raise click.ClickException(f"{case}/{peer} on {folder.name} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def pair(case: str, peers: list[str], folder: Path, repeat: int, **opts) -> dict[str, list[dict]]:
    """Each peer ``repeat`` times, taking turns, so drift in the machine falls on all of them alike."""
    out: dict[str, list[dict]] = {p: [] for p in peers}
    for _ in range(repeat):
        for peer in peers:
            out[peer].append(work(case, peer, folder, **opts))
    return out


def median(runs: list[dict], key: str = "seconds") -> float:
    return statistics.median(r[key] for r in runs)


def cp_seconds(path: Path, repeat: int) -> float:
    """Wall time of ``cp --reflink=never`` of the same bytes (a folder recursively), median."""
    times = []
    for _ in range(repeat):
        dst = path.with_name(path.name + ".cp")
        start = time.perf_counter()
        subprocess.run(["cp", "-r", "--reflink=never", str(path), str(dst)], check=True)
        times.append(time.perf_counter() - start)
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    return statistics.median(times)


def process_seconds(cmd: list[str], out: Path, repeat: int) -> float:
    """Median wall time of ``cmd`` as a whole process (start, imports, work, exit), ``out`` removed before each run."""
    times = []
    for _ in range(repeat):
        shutil.rmtree(out) if out.is_dir() else out.unlink(missing_ok=True)
        start = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        times.append(time.perf_counter() - start)
        if r.returncode != 0:
            raise click.ClickException(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    out.unlink(missing_ok=True)
    return statistics.median(times)


def read_bandwidth() -> float:
    """Bytes/s of the best of five sums over 1 GiB of float32 with every thread: the read bound."""
    import torch
    x = torch.ones(1 << 28)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - start))
    return best


def facts(folder: Path) -> dict:
    """Model bytes (weight files), the largest tensor as stored, and fp32 weight bytes read per decoded token."""
    import math

    from ..loader import open_source
    src = open_source(folder)
    sizes = {n: math.prod(t.shape) * t.dtype.itemsize for n, t in src.tensors.items()}
    params = {n: math.prod(t.shape) for n, t in src.tensors.items()}
    gathered = [n for n in params if n.endswith("wpe.weight")]  # position rows: one read per token
    if not getattr(src.config, "tie_embeddings", True):  # an untied input embedding: one row read per token
        gathered += [n for n in params if n.endswith("embed_tokens.weight")]
    per_token = 4 * (sum(params.values()) - sum(params[n] for n in gathered))
    return {"model_bytes": sum(f.stat().st_size for f in src.files), "largest": max(sizes.values()),
            "per_token": per_token, "context": src.config.context_length}  # per_token in float32; / 2 for bf16


def bench_model(name: str, folder: Path, repeat: int, bandwidth: float) -> list[Row]:
    f = facts(folder)
    rows = []
    peers = ["gptconv", "transformers"]

    runs = pair("load", peers, folder, repeat)
    ours, theirs = median(runs["gptconv"]), median(runs["transformers"])
    rows.append(Row("load to a ready model", name, ours, theirs, "s", ours / theirs, "≤ 0.5", ours / theirs <= 0.5,
                    f"+ first logits: {median(runs['gptconv'], 'first_logits'):.2f} s vs "
                    f"{median(runs['transformers'], 'first_logits'):.2f} s"))

    length = min(1024, f["context"])
    for dtype, target in (("float32", 0.9), ("bfloat16", None)):
        runs = pair("prefill", peers, folder, repeat, dtype=dtype, length=length)
        ours, theirs = median(runs["gptconv"]), median(runs["transformers"])
        rows.append(Row(f"prefill T={length} {dtype}", name, ours, theirs, "s", ours / theirs,
                        "report" if target is None else f"≤ {target}", None if target is None else ours / theirs <= target))
    short = min(512, f["context"])
    runs = pair("prefill", ["gptconv", "llama.cpp"], folder, repeat, dtype="float32", length=short)
    ours, cpp = median(runs["gptconv"]), median(runs["llama.cpp"])
    rows.append(Row(f"prefill T={short} fp32 vs llama.cpp", name, ours, cpp, "s", ours / cpp, "report", None,
                    "ours: every position's logits; llama.cpp: the last one's"))

    new_tokens = min(128, f["context"] - 16)
    runs = pair("decode", ["gptconv", "transformers", "llama.cpp"], folder, repeat, new_tokens=new_tokens)
    ours, theirs, cpp = (median(runs[p], "tokens_per_s") for p in ("gptconv", "transformers", "llama.cpp"))
    same = runs["gptconv"][0]["tokens"] == runs["transformers"][0]["tokens"]
    rows.append(Row(f"decode {new_tokens} greedy, fp32 (tok/s)", name, ours, theirs, "tok/s", ours / theirs, "report",
                    None, "same tokens as transformers" if same else "tokens differ from transformers"))
    rows.append(Row("decode vs llama.cpp, F32 GGUF (tok/s)", name, ours, cpp, "tok/s", ours / cpp, "≥ 1.0",
                    ours / cpp >= 1.0))
    bound = bandwidth / f["per_token"]
    rows.append(Row("decode / memory-bandwidth bound", name, ours, bound, "tok/s", ours / bound, "≥ 0.9",
                    ours / bound >= 0.9, f"{f['per_token'] / MB:.0f} MB/token at {bandwidth / 1e9:.1f} GB/s"))
    fp32 = ours
    runs = pair("decode", ["gptconv", "llama.cpp"], folder, repeat, new_tokens=new_tokens, dtype="bfloat16")
    ours, cpp = median(runs["gptconv"], "tokens_per_s"), median(runs["llama.cpp"], "tokens_per_s")
    rows.append(Row("decode bf16 vs our fp32 (tok/s)", name, ours, fp32, "tok/s", ours / fp32, "≥ 1.8",
                    ours / fp32 >= 1.8, "half the bytes per token"))
    rows.append(Row("decode bf16 vs llama.cpp, BF16 GGUF (tok/s)", name, ours, cpp, "tok/s", ours / cpp, "≥ 1.0",
                    ours / cpp >= 1.0))

    rows += bench_export(name, folder, f, repeat)
    out = folder.parent / f"{name}-export-process.gguf"
    converter_ready(folder)
    ours = process_seconds([sys.executable, "-m", "gptconv", "export", str(folder), "--format", "gguf", "--dtype", "f16",
                            "-o", str(out), "--quiet"], out, repeat)
    theirs = process_seconds([sys.executable, str(llama_cpp_source() / "convert_hf_to_gguf.py"), str(folder), "--outfile", str(out),
                              "--outtype", "f16"], out, repeat)
    rows.append(Row("export GGUF f16 vs llama.cpp's convert_hf_to_gguf.py, whole process", name, ours, theirs, "s",
                    ours / theirs, "≤ 0.5", ours / theirs <= 0.5, "python start, imports and writing, both"))

    runs = [work("verify", "gptconv", folder) for _ in range(repeat)]
    rss = median(runs, "rss_peak")
    base = median(runs, "rss_base")
    rows.append(Row("verify: peak RSS / model bytes", name, rss / MB, f["model_bytes"] / MB, "MB",
                    rss / f["model_bytes"], "≤ 2.0", rss / f["model_bytes"] <= 2.0,
                    f"{(rss - base) / f['model_bytes']:.2f} above the {base / MB:.0f} MB after imports; "
                    f"{runs[0]['reference']}; {'passed' if runs[0]['passed'] else 'FAILED'}"))
    return rows


def bench_export(name: str, folder: Path, f: dict, repeat: int, dtypes=(("gguf", "f16"), ("safetensors", None))) -> list[Row]:
    rows = []
    limit = 512 * MB + 2 * f["largest"]
    for fmt, dtype in dtypes:
        dtype = dtype or ("bf16" if name == "llama-3-8b" else "f32")
        out = folder.parent / f"{name}-export.{'gguf' if fmt == 'gguf' else 'hf'}"
        runs = [work("export", "gptconv", folder, out=str(out), format=fmt, dtype=dtype) for _ in range(repeat)]
        ours, theirs = median(runs), cp_seconds(out, repeat)
        vs_cp = 2.0 if name == "llama-3-8b" else 1.5
        rows.append(Row(f"export {fmt} {dtype}: time vs cp", name, ours, theirs, "s", ours / theirs, f"≤ {vs_cp}",
                        ours / theirs <= vs_cp, f"{runs[0]['bytes'] / MB:.0f} MB written"))
        rss = median(runs, "rss_peak")
        rows.append(Row(f"export {fmt} {dtype}: peak RSS", name, rss / MB, limit / MB, "MB", rss / limit,
                        "≤ 512 MB + 2 × largest", rss <= limit,
                        f"largest tensor {f['largest'] / MB:.0f} MB; {median(runs, 'rss_base') / MB:.0f} MB after imports"))
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    return rows


def bench_scale(folder: Path, bandwidth: float) -> list[Row]:
    """Llama-3-8B: export to GGUF f16, decode in bf16 and verify (streamed), once each."""
    f = facts(folder)
    rows = bench_export("llama-3-8b", folder, f, 1, dtypes=(("gguf", "f16"),))
    run = work("decode", "gptconv", folder, dtype="bfloat16", new_tokens=64)
    per_token = f["per_token"] // 2  # bfloat16 weights
    bound = bandwidth / per_token
    rows.append(Row("decode 64 greedy bf16 / memory-bandwidth bound", "llama-3-8b", run["tokens_per_s"], bound,
                    "tok/s", run["tokens_per_s"] / bound, "≥ 0.8", run["tokens_per_s"] / bound >= 0.8,
                    f"{per_token / MB:,.0f} MB/token at {bandwidth / 1e9:.1f} GB/s; peak RSS {run['rss_peak'] / MB:,.0f} MB"))
    run = work("verify", "gptconv", folder, length=256)
    rows.append(Row("verify: peak RSS / model bytes", "llama-3-8b", run["rss_peak"] / MB, f["model_bytes"] / MB, "MB",
                    run["rss_peak"] / f["model_bytes"], "≤ 1.3", run["rss_peak"] / f["model_bytes"] <= 1.3,
                    f"{'passed' if run['passed'] else 'FAILED'} (max|Δ| {run['max_abs_diff']:.2e}, top-1 {run['top1']:.0%}) "
                    f"in {run['seconds']:.0f} s; {run['reference']}; random input 256 tokens"))
    return rows


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    mem = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    import llama_cpp
    import torch
    import transformers

    from ..layers.linear import one_row_product
    return (f"{cpu}, {os.cpu_count()} cores, {mem / 2**30:.0f} GiB RAM; torch {torch.__version__} "
            f"({torch.get_num_threads()} threads, one-row product {one_row_product()}), "
            f"transformers {transformers.__version__}, llama-cpp-python {llama_cpp.__version__}")


def table(rows: list[Row]) -> str:
    def num(x: float | None, unit: str) -> str:
        if x is None:
            return "—"
        return f"{x:,.0f}" if unit == "MB" else f"{x:.3g}" if unit == "s" else f"{x:.1f}"
    lines = ["| case | model | gptconv | peer | ratio | target | met | note |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        met = "—" if r.met is None else "yes" if r.met else "**no**"
        lines.append(f"| {r.case} | {r.model} | {num(r.ours, r.unit)} {r.unit} | {num(r.peer, r.unit)} {r.unit} | "
                     f"{'—' if r.ratio is None else f'{r.ratio:.2f}'} | {r.target} | {met} | {r.note.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


@click.command()
@click.option("--models", default="gpt2-124m,smollm2-135m", show_default=True)
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(1))
@click.option("--scale", is_flag=True, help="Add the synthetic Llama-3-8B (about 16 GB on disk, made once).")
@click.option("--dir", "root", type=click.Path(path_type=Path),
              default=lambda: os.environ.get("GPTCONV_BENCH_DIR", Path.home() / ".cache" / "gptconv-bench"))
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Also write the rows as JSON.")
def main(models: str, repeat: int, scale: bool, root: Path, json_out: Path | None) -> None:
    root = Path(root)
    click.echo(f"machine: {machine()}")
    bandwidth = read_bandwidth()
    rows: list[Row] = []
    for name in [m for m in models.split(",") if m]:
        click.echo(f"… {name}", err=True)
        rows += bench_model(name, ensure(name, root), repeat, bandwidth)
    if scale:
        click.echo("… llama-3-8b (synthetic)", err=True)
        rows += bench_scale(ensure("llama-3-8b", root), bandwidth)
    click.echo(table(rows))
    if json_out:
        json_out.write_text(json.dumps({"machine": machine(), "bandwidth": bandwidth,
                                        "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
