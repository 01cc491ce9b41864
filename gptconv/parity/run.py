"""verify and record_reference: a source against a reference — transformers live (the float64 truth and
the reference at our dtype), a recorded file, or llama.cpp — and the inputs both sides run."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from ..devices import parse_device
from ..errors import GptconvError, where
from ..layers.kv_cache import cache_window
from ..loader import Source, load_source, open_source, parse_dtype
from ..output import check_output
from ..tokenizer import tokenizer_or_none
from ..tracing import trace_steps
from .compare import TRUTH, Report, compare, parity_inputs
from .hf_reference import gguf_config_disagreements, reference_steps, reference_taps, transformers_model
from .recorded import check_against, read_reference, save_reference


REFERENCES = ("transformers", "llama.cpp")


def verify(source: str | Path, dtype: str = "float32", length: int | None = None, seed: int = 0,
                  reference_file: Path | None = None, revision: str | None = None,
                  blockwise: bool | None = None, against: str = "transformers", device: str = "cpu",
                  on_input: Callable[[int, int], None] = lambda done, total: None) -> Report:
    """Our model against a reference: transformers (live), llama.cpp (a GGUF file), or a recorded file.

    Against transformers (live or recorded), every dtype is judged by one rule: the reference runs in
    float64 (the truth) and in our dtype, and ours passes when it is as close to the truth as the
    reference itself is (``compare.CALIBRATION_FACTOR``). Against llama.cpp (float32 only), to a fixed
    tolerance (``compare.LLAMA_CPP``). ``blockwise``: run both models one block
    at a time (``streaming.py``); by default, when they would not fit in memory side by side.
    ``device``: where both models run (the comparison is on the CPU; llama.cpp runs on the CPU).
    ``on_input(done, total)``: progress, in inputs compared or, streamed, in blocks run (ours and the
    references', every input).
    """
    device = parse_device(device)
    if against not in REFERENCES:
        raise GptconvError(f"--against '{against}': choose {' or '.join(REFERENCES)}")
    dt = parse_dtype(dtype)
    low = dt != torch.float32
    name = str(dt).removeprefix("torch.")
    src = open_source(source, revision)
    if against == "llama.cpp":
        if reference_file is not None:
            raise GptconvError("--reference and --against llama.cpp: choose one reference")
        if low:
            raise GptconvError("verify --against llama.cpp runs in float32 (llama.cpp has no float16 / bfloat16 "
                               "model to compare with ours); verify --dtype float16 / bfloat16 against transformers")
        from .llama_cpp_reference import verify_gguf
        window = cache_window(src.config)  # a window on every layer, which llama.cpp does not apply
        asked = length
        if window is not None and length is None:
            length = min(window, input_length(src, None))  # llama.cpp attends past the window: compare within it
        report = verify_gguf(src, load_source(src, dt, device), verify_inputs(src, length, seed))
        if window is not None and (asked is None or asked > window):
            report.notes.append(f"llama.cpp attends past this model's sliding window ({window}), transformers and "
                                f"gptconv do not: " + ("compared within the window" if asked is None else
                                                      "past it the two differ by design"))
        return report
    if reference_file is not None:
        model = load_source(src, dt, device)
        inputs, runs, meta = read_reference(Path(reference_file))
        if meta.get("arch") != src.arch:
            raise where(reference_file, f"records a '{meta.get('arch')}' model, the source is '{src.arch}'")
        if name not in runs:
            raise where(reference_file, f"records no {name} run of the reference; record one with "
                                        f"`gptconv reference --dtype {name}`")
        ours = {s.name for s in trace_steps(model, torch.zeros(1, 1, dtype=torch.long))[0]}  # a 1-token run
        check_against(Path(reference_file), inputs, runs, src.config, ours)
        return compare(model, inputs, lambda n, ids: runs["float64"][n], source,
                       f"recorded: {reference_file} (fp64 and {name})", lambda n, ids: runs[name][n],
                       on_input=on_input)
    if blockwise is None:
        blockwise = device.type == "cpu" and src.format == "hf" and _too_big_for_two(src, dt)
    if blockwise:
        src = open_source(source, revision, backend="per-tensor")  # each block's tensors unmapped when dropped
    model = load_source(src, dt, device, blockwise=blockwise)
    # an fp32 folder verified in fp32 on the CPU: the weights in memory once for ours and the fp32
    # reference; streamed (blockwise) models hold meta tensors between blocks, and stay where they
    # are (on the CPU)
    place = (lambda m: m) if device.type == "cpu" else (lambda m: m.to(device))  # noqa: E731
    truth = place(transformers_model(src, TRUTH, blockwise=blockwise))
    hf = place(transformers_model(src, dt, blockwise=blockwise))
    inputs = verify_inputs(src, length, seed)
    if blockwise:  # an input takes long: count blocks
        _count_blocks([(model, "blocks.{i}"), *((m, reference_taps(src)["block.{i}"]) for m in (truth, hf))],
                      src.config.n_layers, len(inputs), on_input)
        on_input = lambda done, total: None  # noqa: E731
    import transformers
    run = lambda m: lambda n, ids: reference_steps(m, reference_taps(src), src.config.n_layers, ids)  # noqa: E731
    report = compare(model, inputs, run(truth), source,
                     f"transformers {transformers.__version__} (fp64 and {name}, eager{', blockwise' if blockwise else ''})",
                     run(hf), on_input=on_input)
    if src.format == "gguf":  # the reference runs on our reading of the file's metadata: check it
        misread, unchecked = gguf_config_disagreements(src)
        report.notes += misread + unchecked
        report.passed = report.passed and not misread
    return report


def _count_blocks(models: list[tuple[torch.nn.Module, str]], n_layers: int, n_inputs: int,
                  progress: Callable[[int, int], None]) -> None:
    """``progress(done, total)`` after every block any of ``models`` runs (block names ``template``)."""
    total, done = n_inputs * len(models) * n_layers, [0]

    def tick(*_args) -> None:
        done[0] += 1
        progress(done[0], total)
    for model, template in models:
        for i in range(n_layers):
            model.get_submodule(template.format(i=i)).register_forward_hook(tick)


def _too_big_for_two(src: Source, dtype: torch.dtype) -> bool:
    """Would our model (in ``dtype``) and the references (float64, the truth, and ``dtype``) together
    take over half the free memory? From an fp32 folder, verified in fp32, ours and the fp32
    reference share one copy of the weights."""
    n = sum(math.prod(t.shape) for t in src.tensors.values())
    shared = src.format == "hf" and dtype == torch.float32 and set(src.stored_types.values()) == {"float32"}
    return n * (dtype.itemsize + (0 if shared else dtype.itemsize) + TRUTH.itemsize) > 0.5 * _available_memory()


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def record_reference(source: str, out: Path, length: int | None = None, seed: int = 0,
                     revision: str | None = None, dtype: str = "float32", force: bool = False) -> Path:
    """Write transformers' outputs on the fixed inputs to ``out`` (safetensors) for a later verify:
    its float64 run (the truth), its float32 run, and its run in ``dtype`` too when that is float16
    or bfloat16 (the reference's own error at each). An existing ``out`` is replaced only with ``force``."""
    import transformers
    check_output(out, force)  # before the runs
    src = open_source(source, revision)
    inputs = verify_inputs(src, length, seed)
    runs = {}
    for dt in dict.fromkeys([TRUTH, torch.float32, parse_dtype(dtype)]):
        hf = transformers_model(src, dt)
        runs[str(dt).removeprefix("torch.")] = {name: reference_steps(hf, reference_taps(src), src.config.n_layers, ids)
                                                for name, ids in inputs.items()}
        del hf
    save_reference(Path(out), runs, inputs, {"arch": src.arch, "source": str(source),
                                             "transformers": transformers.__version__}, force)
    return Path(out)


def verify_inputs(src: Source, length: int | None, seed: int) -> dict:
    """The fixed prompts and the seeded random ids both sides run."""
    return parity_inputs(tokenizer_or_none(src), src.config.vocab_size, input_length(src, length), seed)


def input_length(src: Source, length: int | None) -> int:
    """Random-input length: the full context by default, capped at 1024 positions or, for a model with
    a sliding window, 128 past the window (so that the window is tested)."""
    limit = src.config.context_length
    window = getattr(src.config, "sliding_window", None) or 0
    length = length or min(limit, max(1024, window + 128))
    if not 0 < length <= limit:
        raise GptconvError(f"--length {length}: the model has {limit} positions")
    return length
