"""One measurement in a fresh process: ``python -m gptconv.bench.worker CASE PEER FOLDER [OPTIONS-JSON]``.

Imports come first and are not timed; then the case runs, and one JSON line reports
``seconds`` (the measured part), ``rss_base`` (peak RSS after the imports), ``rss_peak`` (peak
RSS at the end) in bytes, and whatever else the case measured.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

PROMPT_LEN = 16
NEW_TOKENS = 128


def peak_rss() -> int:
    """This process's peak resident memory, in bytes. (Not getrusage's ru_maxrss: Linux carries the
    parent's peak across fork and exec, so a worker would report its launcher's.)"""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def ids(vocab: int, length: int, seed: int = 0):
    import torch
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def hf_model(folder: Path, dtype):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def case_load(peer: str, folder: Path, opts: dict) -> dict:
    import torch
    if peer == "gptconv":
        import gptconv
        load = lambda: gptconv.load(folder)  # noqa: E731
    else:
        load = lambda: hf_model(folder, torch.float32)  # noqa: E731
    start = time.perf_counter()
    model = load()
    loaded = time.perf_counter() - start
    with torch.no_grad():  # and its first logits: every weight page read once
        model(ids(model.config.vocab_size, 8))
    return {"seconds": loaded, "first_logits": time.perf_counter() - start}


def _llama_cpp(path: Path, n_ctx: int):
    import torch
    from llama_cpp import Llama
    return Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=torch.get_num_threads(),
                 n_threads_batch=torch.get_num_threads(), type_k=0, type_v=0, verbose=False)


def case_prefill(peer: str, folder: Path, opts: dict) -> dict:
    """One forward pass over ``length`` tokens (llama.cpp: its F32 GGUF, evaluated in one batch)."""
    import torch
    dtype = getattr(torch, opts["dtype"])
    if peer == "llama.cpp":
        llm = _llama_cpp(folder / "model-f32.gguf", opts["length"] + 8)
        tokens = ids(llm.n_vocab(), opts["length"])[0].tolist()

        def forward() -> None:
            llm.reset()
            llm.eval(tokens)
    elif peer == "gptconv":
        import gptconv
        model = gptconv.load(folder, dtype=dtype)
        x = ids(model.config.vocab_size, opts["length"])
        forward = lambda: model(x)  # noqa: E731
    else:
        model = hf_model(folder, dtype)
        x = ids(model.config.vocab_size, opts["length"])
        forward = lambda: model(x, use_cache=False).logits  # noqa: E731
    times = []
    with torch.no_grad():
        forward()  # warm-up
        for _ in range(opts.get("repeat", 3)):
            start = time.perf_counter()
            forward()
            times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times)}


def case_decode(peer: str, folder: Path, opts: dict) -> dict:
    """``new_tokens`` (128) greedy tokens after a 16-token prompt; tokens/s over the whole call, prefill included.
    ``device`` and ``dtype`` (cpu, float32 by default) for gptconv and transformers (scripts/device-check.sh)."""
    import torch
    new_tokens = opts.get("new_tokens", NEW_TOKENS)
    device, dtype = opts.get("device", "cpu"), getattr(torch, opts.get("dtype", "float32"))
    if peer == "llama.cpp":  # the GGUF of the dtype asked for (F32 or BF16)
        gguf = folder / f"model-{'bf16' if dtype == torch.bfloat16 else 'f32'}.gguf"
        llm = _llama_cpp(gguf, PROMPT_LEN + new_tokens + 8)
        prompt = ids(llm.n_vocab(), PROMPT_LEN)[0].tolist()

        def run(n: int) -> list[int]:
            out = []
            for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
                out.append(token)
                if len(out) == n:
                    return out
            return out
    elif peer == "gptconv":
        import gptconv
        from gptconv.decoding import generate_ids as generate
        model = gptconv.load(folder, dtype=dtype, device=device)
        prompt = ids(model.config.vocab_size, PROMPT_LEN)[0].tolist()
        run = lambda n: generate(model, prompt, n)  # noqa: E731
    else:
        model = hf_model(folder, dtype).to(device)
        x = ids(model.config.vocab_size, PROMPT_LEN).to(device)

        def run(n: int) -> list[int]:
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
            return out[0, PROMPT_LEN:].tolist()
    with torch.no_grad():
        run(8)  # warm-up
        start = time.perf_counter()
        tokens = run(new_tokens)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens_per_s": len(tokens) / seconds, "tokens": tokens[:16]}


def case_export(peer: str, folder: Path, opts: dict) -> dict:
    from gptconv.writers import export
    out = Path(opts["out"])
    if out.exists():  # a fresh destination, as cp gets
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    start = time.perf_counter()
    summary = export(str(folder), out, opts["format"], opts["dtype"])
    return {"seconds": time.perf_counter() - start, "bytes": sum(f.bytes for f in summary.files)}


def case_verify(peer: str, folder: Path, opts: dict) -> dict:
    """verify of a folder or a GGUF file (``against``: transformers or llama.cpp): its verdict, where its
    time went, its phases' peaks, and the bytes it read from the disk (its own and its children's: the
    quantizer that rewrites a file for llama.cpp)."""
    import resource

    import transformers  # noqa: F401  (imported before the baseline, as gptconv's are)

    from gptconv.api import verify
    before = read_bytes() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512  # the imports' reads before
    start = time.perf_counter()
    report = verify(str(folder), opts.get("dtype", "float32"), opts.get("length"), blockwise=opts.get("stream"),
                    against=opts.get("against", "transformers"))
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512
    return {"seconds": time.perf_counter() - start, "passed": report.passed, "max_abs_diff": report.max_abs_diff,
            "top1": report.top1_agreement, "reference": report.reference, "where": report.seconds,
            "peaks": report.peaks, "read_bytes": read_bytes() + children - before, "inputs": report.inputs}


def read_bytes() -> int:
    """Bytes this process has read from the disk (page cache hits not counted)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


CASES = {"load": case_load, "prefill": case_prefill, "decode": case_decode, "export": case_export,
         "verify": case_verify}


def main() -> None:
    case, peer, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    opts = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    import torch  # noqa: F401
    if peer == "gptconv" or case in ("export", "verify"):
        import gptconv  # noqa: F401
    if peer == "transformers" or case == "verify":
        import transformers
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        if folder.is_dir():  # the model class's module, imported too
            config = json.loads((folder / "config.json").read_text())
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config["model_type"]])
    if peer == "llama.cpp":
        import llama_cpp  # noqa: F401
    base = peak_rss()
    result = CASES[case](peer, folder, opts)
    result.update(rss_base=base, rss_peak=peak_rss())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
