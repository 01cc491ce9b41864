"""``python -m gptconv.bench [--models gpt2-124m,smollm2-135m] [--repeat 3] [--scale] [--json FILE]``

Prints, per case and model, gptconv's median beside its peer's median from the same run, their
ratio, and the target; ``--scale`` adds the synthetic Llama-3-8B (made once, ~16 GB, in the bench
folder: ``--dir`` or ``$GPTCONV_BENCH_DIR``, default ``~/.cache/gptconv-bench``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from .checkpoints import converter_ready, ensure, ensure_gguf, llama_cpp_source

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
            "per_token": per_token, "context": src.config.context_length,  # per_token in float32; / 2 for bf16
            "params": sum(params.values())}


def bench_model(name: str, folder: Path, repeat: int, bandwidth: float) -> list[Row]:
    """Every case on one model: running it (``bench_running``), then writing and verifying it (``bench_outputs``)."""
    f = facts(folder)
    return bench_running(name, folder, f, repeat, bandwidth) + bench_outputs(name, folder, f, repeat)


def bench_running(name: str, folder: Path, f: dict, repeat: int, bandwidth: float) -> list[Row]:
    """Load, prefill (both dtypes, and against llama.cpp), decode (against transformers, llama.cpp and the
    memory-bandwidth bound, fp32 and bf16)."""
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
    return rows


def bench_outputs(name: str, folder: Path, f: dict, repeat: int) -> list[Row]:
    """Export (time against cp, peak memory; the whole process against llama.cpp's converter) and verify's peak."""
    rows = bench_export(name, folder, f, repeat)
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
    """Llama-3-8B: export to GGUF f16, decode in bf16 once; verify (streamed by its own plan) from the HF
    folder and from its q8_0 and q4_k_m GGUF files, against transformers and against llama.cpp; and
    Llama-3.2-1B's q8_0 GGUF against transformers."""
    f = facts(folder)
    rows = bench_export("llama-3-8b", folder, f, 1, dtypes=(("gguf", "f16"),))
    run = work("decode", "gptconv", folder, dtype="bfloat16", new_tokens=64)
    per_token = f["per_token"] // 2  # bfloat16 weights
    bound = bandwidth / per_token
    rows.append(Row("decode 64 greedy bf16 / memory-bandwidth bound", "llama-3-8b", run["tokens_per_s"], bound,
                    "tok/s", run["tokens_per_s"] / bound, "≥ 0.8", run["tokens_per_s"] / bound >= 0.8,
                    f"{per_token / MB:,.0f} MB/token at {bandwidth / 1e9:.1f} GB/s; peak RSS {run['rss_peak'] / MB:,.0f} MB"))
    sources = [("HF folder", folder), ("q8_0 GGUF", ensure_gguf(folder, "q8_0")),
               ("q4_k_m GGUF", ensure_gguf(folder, "q4_k_m"))]
    for label, path in sources:
        for against in ("transformers", "llama.cpp"):
            if against == "llama.cpp" and path.is_dir():
                continue
            rows += verify_rows("llama-3-8b", label, path, against, GB_8)
    small = ensure("llama-3.2-1b", folder.parent)
    gguf = ensure_gguf(small, "q8_0")
    run = verify_run(gguf, "transformers")
    f32 = 4 * facts(small)["params"]
    rows.append(Row("verify q8_0 GGUF: peak RSS / f32 weights", "llama-3.2-1b", run["rss_peak"] / MB, f32 / MB, "MB",
                    run["rss_peak"] / f32, "≤ 2.5", run["rss_peak"] / f32 <= 2.5, verdict(run)))
    return rows


GB_8 = 8e9  # issue 48: an 8B verify within 8 GB on a 24 GiB machine


def verify_run(path: Path, against: str) -> dict:
    """One verify in a worker of its own, the page cache dropped first where this process may (so that the
    bytes read are the disk's); its report."""
    dropped = drop_page_cache()
    run = work("verify", "gptconv", path, against=against)
    run["cache"] = "page cache dropped" if dropped else "page cache warm"
    return run


def verify_rows(model: str, label: str, path: Path, against: str, bound: float) -> list[Row]:
    """verify of ``path``: its peak RSS against ``bound`` (against llama.cpp: ours' phase, llama.cpp's own
    beside it), the bytes it read against 4× the file's, and its time, where it went."""
    size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.glob("*.safetensors")))
    if against == "llama.cpp":  # llama.cpp's F32 copy of the file goes to the temporary folder first
        f32, free = 4 * facts_of_gguf(path), shutil.disk_usage(tempfile.gettempdir()).free
        if f32 > 0.95 * free:
            return [Row(f"verify {label} vs {against}", model, None, None, "MB", None, "≤ 1.0", None,
                        f"not run: llama.cpp's F32 copy needs {f32 / 1e9:.1f} GB of disk, {free / 1e9:.1f} GB free")]
    run = verify_run(path, against)
    peak = run["peaks"].get("ours", run["rss_peak"])
    case = f"verify {label} vs {against}"
    note = verdict(run) + (f"; llama.cpp's phase {run['peaks']['llama.cpp'] / MB:,.0f} MB (its model mapped)"
                           if "llama.cpp" in run["peaks"] else "")
    rows = [Row(f"{case}: peak RSS / 8 GB", model, peak / MB, bound / MB, "MB", peak / bound, "≤ 1.0",
                peak <= bound, note),
            Row(f"{case}: bytes read / file", model, run["read_bytes"] / MB, size / MB, "MB", run["read_bytes"] / size,
                "≤ 4.0", run["read_bytes"] <= 4 * size, run["cache"])]
    where = ", ".join(f"{k} {v:.0f} s" for k, v in run["where"].items() if v >= 0.5)
    rows.append(Row(f"{case}: wall time", model, run["seconds"], None, "s", None, "report", None, where))
    return rows


def facts_of_gguf(path: Path) -> int:
    """The elements of every tensor of a GGUF file."""
    from ..loader import open_source
    return sum(math.prod(t.shape) for t in open_source(str(path)).tensors.values())


def verdict(run: dict) -> str:
    return (f"{'passed' if run['passed'] else 'FAILED'} (max|Δ| {run['max_abs_diff']:.2e}, top-1 {run['top1']:.0%}); "
            f"{run['reference']}; inputs {run['inputs']}")


def drop_page_cache() -> bool:
    """Write the dirty pages out and drop the clean ones from the page cache, where this process may."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


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
