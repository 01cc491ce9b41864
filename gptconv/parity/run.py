"""verify and record_reference: a source against a reference — transformers live (the float64 truth and
the reference at our dtype), a recorded file, or llama.cpp — and the inputs both sides run."""

from __future__ import annotations

import json

from collections.abc import Callable
from pathlib import Path

import torch

from .. import memory
from ..devices import parse_device
from ..errors import GptconvError, where
from ..layers.kv_cache import cache_window, sliding_window
from ..loader import Source, load_source, open_source, parse_dtype
from ..output import check_output, identity
from ..tokenizer import tokenizer_or_none
from .compare import OURS_RUN, OWN_RUN, TRUTH, TRUTH_RUN, Calibrated, Report, parity_inputs
from .hf_reference import gguf_config_disagreements, reference_steps, reference_taps, transformers_model  # noqa: F401
from .lockstep import Run, expand, kept, lockstep, our_run, reference_run
from .recorded import check_against, check_recorded, coverage_notes, read_reference, save_reference, weight_hashes


REFERENCES = ("transformers", "llama.cpp")


def verify(source: str | Path, dtype: str = "float32", length: int | None = None, seed: int = 0,
                  reference_file: Path | None = None, revision: str | None = None,
                  blockwise: bool | None = None, against: str = "transformers", device: str = "cpu",
                  on_input: Callable[[int, int], None] = lambda done, total: None) -> Report:
    """Our model against a reference: transformers (live), llama.cpp (a GGUF file), or a recorded file.

    Against transformers (live or recorded), every dtype is judged by one rule: the reference runs in
    float64 (the truth) and in our dtype, and ours passes when it is as close to the truth as the
    reference itself is (``compare.CALIBRATION_FACTOR``). Against llama.cpp (float32 only), to a fixed
    tolerance (``compare.LLAMA_CPP``). The models run in lockstep (``lockstep.py``), each step
    compared as soon as it exists. ``blockwise``: their weights streamed, one block at a time
    (``gptconv.streaming``); by default, when they would not fit in memory side by side.
    ``device``: where the models run (the comparison is on the CPU; llama.cpp runs on the CPU).
    ``on_input(done, total)``: progress, in steps compared.
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
        inputs = verify_inputs(src, length, seed)
        stream = plan_stream(src, dt, device, blockwise, inputs, "llama.cpp")
        report = verify_gguf(src, lambda dtype: load_source(src, dtype, device, blockwise=stream, solo=False), inputs)
        if window is not None and (asked is None or asked > window):
            report.notes.append(f"llama.cpp attends past this model's sliding window ({window}), transformers and "
                                f"gptconv do not: " + ("compared within the window" if asked is None else
                                                      "past it the two differ by design"))
        return report
    if reference_file is not None:
        return _against_recorded(src, source, revision, Path(reference_file), dt, device, blockwise, on_input)
    inputs = verify_inputs(src, length, seed)
    stream = plan_stream(src, dt, device, blockwise, inputs, "transformers")
    src = _opened(src, source, revision, stream)
    place = (lambda m: m) if device.type == "cpu" else (lambda m: m.to(device))  # noqa: E731
    rows = device.type == "cpu"  # a model on another device holds its tables whole
    truth_model = transformers_model(src, TRUTH, blockwise=stream, solo=False, rows=rows)
    reading = getattr(truth_model, "reading", None)
    own_model = transformers_model(src, dt, blockwise=stream, reading=reading, solo=False, rows=rows)
    model = load_source(src, dt, device, blockwise=stream, solo=False)
    taps = reference_taps(src)
    import transformers
    tally = Calibrated(dt, str(source), f"transformers {transformers.__version__} (fp64 and {name}, eager"
                                        f"{', blockwise' if stream else ''})", inputs)
    runs = [reference_run(place(truth_model), TRUTH_RUN, src, taps), reference_run(place(own_model), OWN_RUN, src, taps),
            our_run(model, set(expand(taps, src.config.n_layers)))]
    seconds = lockstep(runs, inputs, lambda step, run, input_name, t: tally.add(step, run.role, input_name, kept(t)),
                       _progress(len(expand(taps, src.config.n_layers)) + 1, on_input))
    report = tally.verdict()
    report.seconds = seconds
    if src.format == "gguf":  # the reference runs on our reading of the file's metadata: check it
        misread, unchecked = gguf_config_disagreements(src, getattr(reading, "read_config", None))
        report.notes += misread + unchecked
        report.passed = report.passed and not misread
    return report


def _against_recorded(src: Source, source: str | Path, revision: str | None, path: Path, dt: torch.dtype,
                      device: torch.device, blockwise: bool | None, on_input: Callable[[int, int], None]) -> Report:
    """Our model against a file ``gptconv reference`` recorded: its float64 run is the truth, its run in
    our dtype the reference's own error."""
    name = str(dt).removeprefix("torch.")
    inputs, runs, meta = read_reference(path)
    if meta.get("arch") != src.arch:
        raise where(path, f"records a '{meta.get('arch')}' model, the source is '{src.arch}'")
    if name not in runs:
        raise where(path, f"records no {name} run of the reference; record one with `gptconv reference --dtype {name}`")
    check_against(path, inputs, runs, src.config, None)
    check_recorded(path, runs)
    expected = verify_inputs(src, None, 0)
    notes = coverage_notes(path, inputs, runs, meta, expected, set(expand(reference_taps(src), src.config.n_layers)),
                           src.files)
    stream = plan_stream(src, dt, device, blockwise, inputs, "recorded", held=path.stat().st_size)
    model = load_source(_opened(src, source, revision, stream), dt, device, blockwise=stream, solo=False)
    tally = Calibrated(dt, str(source), f"recorded: {path} (fp64 and {name})", inputs)
    recorded = set().union(*(steps.keys() for r in runs.values() for steps in r.values()))
    seen: set[str] = set()

    def take(step: str, _run: Run, input_name: str, tensor: torch.Tensor) -> None:
        if step not in recorded:  # a streamed block's stop (see ``our_run``), not in the file
            return
        seen.add(step)
        for role, run in ((TRUTH_RUN, "float64"), (OWN_RUN, name)):
            if step not in runs[run][input_name]:
                raise where(path, f"the {run} run of '{input_name}' records no step '{step}'")
            tally.add(step, role, input_name, runs[run][input_name][step])
        tally.add(step, OURS_RUN, input_name, kept(tensor))
    progress = _progress(len(recorded), on_input)
    seconds = lockstep([our_run(model, recorded)], inputs, take, lambda step: step in recorded and progress(step))
    unknown = sorted(recorded - seen)
    if unknown:
        raise where(path, f"records a step '{unknown[0]}' this model does not have")
    report = tally.verdict()
    report.seconds = seconds
    report.notes += notes
    return report


def _progress(total: int, on_input: Callable[[int, int], None]) -> Callable[[str], None]:
    done = [0]

    def step(_name: str) -> None:
        done[0] += 1
        on_input(done[0], total)
    return step


def verify_need(src: Source, dtype: torch.dtype, lengths: list[int], stream: bool, reference: str,
                shape: memory.Shape | None = None, held: int = 0) -> memory.Need:
    """What verify of ``src`` (or ``gptconv reference``: ``reference`` "record") will hold at its peak."""
    shape = shape or memory.Shape.of(src.config)
    stored = 4 if src.format == "gguf" else max((t.dtype.itemsize for t in src.tensors.values()
                                                 if t.dtype.is_floating_point), default=4)
    shared = src.format == "hf" and dtype == torch.float32 and set(src.stored_types.values()) == {"float32"}
    return memory.verify_need(src.name, shape, lengths, dtype, stored, stream, shared, reference, held)


def plan_stream(src: Source, dtype: torch.dtype, device: torch.device, asked: bool | None,
                inputs: dict[str, torch.Tensor], reference: str, held: int = 0) -> bool:
    """Whether the runs stream (as asked; by default, where the whole models would not fit and streamed
    ones do), refusing in one line a plan that fits neither way (``memory.check``)."""
    shape = memory.Shape.of(src.config)
    lengths = [ids.shape[1] for ids in inputs.values()]

    def need(stream: bool, lengths: list[int] = lengths) -> memory.Need:
        return verify_need(src, dtype, lengths, stream, reference, shape, held)
    can_stream = device.type == "cpu" and streamable(src, reference)
    if asked is not None:
        stream = asked
    else:
        stream = can_stream and need(False).peak > memory.available() and need(True).peak <= memory.available()
    alternatives = [("--stream", lambda: need(True))] if can_stream and not stream else []
    for n in (256, 64):
        if n < max(lengths):
            both = can_stream and not stream
            alternatives.append((f"{'--stream ' if both else ''}--length {n}",
                                 lambda n=n: need(stream or can_stream, [min(x, n) for x in lengths])))
    memory.check(need(stream), alternatives)
    return stream


def streamable(src: Source, reference: str) -> bool:
    """Whether the runs of a verify of ``src`` can stream: ours always can; transformers' reference reads a
    multimodal checkpoint, and the GGUF architectures of its quantizer, whole."""
    if reference not in ("transformers", "record"):
        return True
    from .hf_reference import streams
    return streams(src)


def _opened(src: Source, source: str | Path, revision: str | None, stream: bool) -> Source:
    """``src``, or opened again so that each tensor's mapping goes with it (a streamed HF folder)."""
    if stream and src.format == "hf":
        return open_source(source, revision, backend="per-tensor")
    return src


def record_reference(source: str, out: Path, length: int | None = None, seed: int = 0,
                     revision: str | None = None, dtype: str = "float32", force: bool = False) -> Path:
    """Write transformers' outputs on the fixed inputs to ``out`` (safetensors) for a later verify:
    its float64 run (the truth), its float32 run, and its run in ``dtype`` too when that is float16
    or bfloat16 (the reference's own error at each). An existing ``out`` is replaced only with ``force``."""
    import transformers
    check_output(out, force)  # before the runs
    seen = identity(out)  # what --force may replace: what is there now, not what appears meanwhile
    src = open_source(source, revision)
    inputs = verify_inputs(src, length, seed)
    stream = plan_stream(src, parse_dtype(dtype), torch.device("cpu"), None, inputs, "record")
    src = _opened(src, source, revision, stream)
    taps, reading, models = reference_taps(src), None, []
    for dt in dict.fromkeys([TRUTH, torch.float32, parse_dtype(dtype)]):
        hf = transformers_model(src, dt, blockwise=stream, reading=reading, solo=False)
        reading = getattr(hf, "reading", None)
        models.append(reference_run(hf, str(dt).removeprefix("torch."), src, taps))
    runs: dict[str, dict[str, dict[str, torch.Tensor]]] = {}

    def take(step: str, run: Run, input_name: str, t: torch.Tensor) -> None:
        runs.setdefault(run.role, {}).setdefault(input_name, {})[step] = kept(t)
    lockstep(models, inputs, take)
    del models
    save_reference(Path(out), runs, inputs, {"arch": src.arch, "source": str(source),
                                             "transformers": transformers.__version__,
                                             "weights": json.dumps(weight_hashes(src.files))}, force,
                   keep=src.read_from(), seen=seen)
    return Path(out)


def verify_inputs(src: Source, length: int | None, seed: int) -> dict:
    """The fixed prompts and the seeded random ids both sides run."""
    return parity_inputs(tokenizer_or_none(src), src.config.vocab_size, input_length(src, length), seed)


def input_length(src: Source, length: int | None) -> int:
    """Random-input length: the full context by default, capped at 1024 positions or, for a model with
    a sliding window, 128 past the window (so that the window is tested)."""
    limit = src.config.context_length
    window = sliding_window(src.config) or 0
    length = length or min(limit, max(1024, window + 128))
    if not 0 < length <= limit:
        raise GptconvError(f"--length {length}: the model has {limit} positions")
    return length
