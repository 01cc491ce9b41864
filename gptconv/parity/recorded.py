"""A recorded reference: transformers' outputs on the parity inputs, saved by ``gptconv reference``
(safetensors) for a later ``verify --reference`` on a machine without transformers."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import where
from ..output import Seen, atomic_output, sha256_file
from ..sources.files import UNLIMITED, regular_file

FORMAT = "2"  # 2: with the float64 run every verdict is calibrated by; 1 had none
Runs = dict[str, dict[str, dict[str, torch.Tensor]]]  # dtype name → input name → step → tensor


def save_reference(path: Path, runs: Runs, inputs: dict[str, torch.Tensor], meta: dict[str, str],
                   force: bool = False, keep: tuple[Path, ...] = (), seen: Seen = "now") -> None:
    """Keys: ``input/ids``, ``input/step`` (the float32 run) and ``input/dtype/step`` (another run:
    float64, the truth, and float16 / bfloat16)."""
    tensors = {f"{name}/ids": ids.contiguous() for name, ids in inputs.items()}
    for run, records in runs.items():
        prefix = "" if run == "float32" else f"{run}/"
        for name, steps in records.items():
            tensors.update({f"{name}/{prefix}{step}": t.contiguous() for step, t in steps.items()})
    meta = {**meta, "gptconv_reference": FORMAT, "inputs": json.dumps(list(inputs))}
    with atomic_output(path, force, keep=keep, seen=seen) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def read_reference(path: Path) -> tuple[dict[str, torch.Tensor], Runs, dict[str, str]]:
    """(inputs, steps per run and input, metadata) from a file ``save_reference`` wrote."""
    regular_file(path, UNLIMITED)
    try:
        f = safe_open(str(path), framework="pt")
        meta = f.metadata() or {}
        if meta.get("gptconv_reference") == "1":
            raise where(path, "recorded by an older gptconv, without the float64 run verify now judges by; "
                              "record it again with `gptconv reference`")
        if meta.get("gptconv_reference") != FORMAT:
            raise where(path, "not a gptconv reference file (write one with `gptconv reference`)")
        names = json.loads(meta["inputs"])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise where(path, "its list of inputs is not a list of names")
        inputs, runs = {}, {}
        for key in f.keys():
            parts = key.split("/")
            if parts[0] not in names or len(parts) not in (2, 3):
                raise where(path, f"tensor '{key}' belongs to no listed input")
            if parts[1:] == ["ids"]:
                inputs[parts[0]] = f.get_tensor(key)
            else:
                run = parts[1] if len(parts) == 3 else "float32"
                runs.setdefault(run, {}).setdefault(parts[0], {})[parts[-1]] = f.get_tensor(key)
    except (SafetensorError, OSError, KeyError, TypeError, ValueError, RecursionError) as e:
        raise where(path, f"not a readable reference file ({type(e).__name__}: {str(e)[:200]})") from None
    for run, records in runs.items():
        missing = [n for n in names if "logits" not in records.get(n, {})]
        if missing:
            raise where(path, f"input '{missing[0]}' has no logits in the {run} run")
    missing = [n for n in names if n not in inputs]
    if missing or "float64" not in runs:
        raise where(path, f"input '{missing[0]}' has no ids" if missing else "has no float64 run")
    return inputs, runs, meta


def check_against(path: Path, inputs: dict[str, torch.Tensor], runs: Runs, config: object,
                  steps: set[str] | None) -> None:
    """The recorded file fits the model it is to judge: token ids in its vocabulary and context, only
    steps the model has (``steps``), each of the shape the model gives it."""
    for name, ids in inputs.items():
        if ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64) or ids.numel() == 0:
            raise where(path, f"input '{name}': ids are not a (1, T) integer tensor")
        if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size or ids.shape[1] > config.context_length:
            raise where(path, f"input '{name}' does not fit this model (vocabulary {config.vocab_size:,}, "
                              f"context {config.context_length:,}): recorded for another one?")
    for run, records in runs.items():
        for name, recorded in records.items():
            batch, length = inputs[name].shape
            for step, t in recorded.items():
                if steps is not None and step not in steps:
                    raise where(path, f"the {run} run of '{name}' records a step '{step}' this model does not have")
                width = config.vocab_size if step == "logits" else config.d_model
                if tuple(t.shape) != (batch, length, width):
                    raise where(path, f"the {run} run of '{name}': step '{step}' is {list(t.shape)}, this model "
                                      f"gives {[batch, length, width]}")



# A recorded run in a lower precision is a rounding of the recorded float64 run, or the file is not a
# reference: at every step its RMS distance from the truth, relative to the truth's RMS, stays within
# ROUNDING (float32 runs: ~1e-7 … 1e-5 measured; bfloat16 / float16: ~1e-3 … 0.1), and at the logits its
# top-1 agrees with the truth's at TOP1 of the positions. A file outside them (a run of noise, which would
# widen every tolerance it calibrates) is refused in one line.
ROUNDING = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.5}
TOP1 = {"float32": 0.99, "bfloat16": 0.5, "float16": 0.5}


def check_recorded(path: Path, runs: Runs) -> None:
    """Each run stored as gptconv writes it (the truth in float64, the others in float32, every step
    floating point), and each lower-precision run a plausible rounding of the truth."""
    for run, records in runs.items():
        want = torch.float64 if run == "float64" else torch.float32
        if run != "float64" and run not in ROUNDING:
            raise where(path, f"records a run '{run}', which is no dtype verify compares")
        for name, steps in records.items():
            for step, t in steps.items():
                if t.dtype != want:
                    raise where(path, f"the {run} run of '{name}': step '{step}' is stored as "
                                      f"{str(t.dtype).removeprefix('torch.')}, not {str(want).removeprefix('torch.')}")
                if run in ("float64", "float32") and not torch.isfinite(t).all():  # bf16 / f16 may overflow
                    raise where(path, f"the {run} run of '{name}' holds NaN or Inf at '{step}': "
                                      + ("no truth to judge by" if run == "float64" else
                                         "no reference error to calibrate by") + "; record it again")
    truth = runs["float64"]
    for run, records in runs.items():
        if run == "float64":
            continue
        agree = total = 0
        for name, steps in records.items():
            for step, t in steps.items():
                exact = truth.get(name, {}).get(step)
                if exact is None or not (torch.isfinite(t).all() and torch.isfinite(exact).all()):
                    continue  # a step the truth lacks is refused by the comparison; overflow is judged there
                scale = exact.pow(2).mean().sqrt().item()
                off = (t.double() - exact).pow(2).mean().sqrt().item()
                if off > ROUNDING[run] * scale + 1e-30:
                    raise where(path, f"the {run} run of '{name}' is no rounding of the float64 run at '{step}' "
                                      f"(RMS apart {off:.3g}, {off / scale if scale else float('inf'):.3g} of the "
                                      f"step's own): not a reference to calibrate by; record it again")
                if step == "logits":
                    agree += int((t.argmax(-1) == exact.argmax(-1)).sum())
                    total += t.shape[:-1].numel()
        if total and agree / total < TOP1[run]:
            raise where(path, f"the {run} run's top-1 agrees with the float64 run's at {agree / total:.2%} of the "
                              f"positions: no rounding of it, not a reference to calibrate by; record it again")


def weight_hashes(files: list[Path]) -> dict[str, str]:
    """The sha256 of each weight file, by name: what a recorded reference was recorded from."""
    return {Path(f).name: sha256_file(Path(f)) for f in files}


def coverage_notes(path: Path, inputs: dict[str, torch.Tensor], runs: Runs, meta: dict[str, str],
                   expected_ids: dict[str, torch.Tensor], expected_steps: set[str], files: list[Path]) -> list[str]:
    """What the verdict must say about the file: weights other than the source's, fewer inputs, positions or
    steps than verify compares by default, prompts whose ids are not what the source's tokenizer gives."""
    expected_inputs = {n: ids.shape[1] for n, ids in expected_ids.items()}
    notes = []
    try:
        recorded = json.loads(meta.get("weights", "null") or "null")
    except ValueError:
        raise where(path, "its list of the weights it was recorded from is not JSON") from None
    if not isinstance(recorded, dict):
        notes.append(f"{path.name} does not say which weights it was recorded from: nothing ties it to this source")
    elif recorded != (ours := weight_hashes(files)):
        first = next((n for n in sorted(set(recorded) | set(ours)) if recorded.get(n) != ours.get(n)), "?")
        notes.append(f"{path.name} was recorded from other weights than this source's ({first}: sha256 "
                     f"{str(recorded.get(first, 'absent'))[:12]} recorded, {str(ours.get(first, 'absent'))[:12]} here): "
                     "the verdict compares this model with that one")
    missing = [n for n in expected_inputs if n not in inputs]
    short = [n for n, length in expected_inputs.items() if n in inputs and inputs[n].shape[1] < length]
    if missing:
        notes.append(f"covers {len(expected_inputs) - len(missing)} of verify's {len(expected_inputs)} inputs "
                     f"(no {', '.join(missing)})")
    for n in (n for n, ids in expected_ids.items() if n.startswith("prompt") and n in inputs):
        theirs = inputs[n][:, :expected_ids[n].shape[1]]
        if theirs.shape != expected_ids[n][:, :theirs.shape[1]].shape or \
                not torch.equal(theirs.long(), expected_ids[n][:, :theirs.shape[1]].long()):
            notes.append(f"its input '{n}' holds other token ids than this source's tokenizer gives for verify's "
                         f"{n}: recorded with another tokenizer, or altered")
    for n in short:
        notes.append(f"its input '{n}' has {inputs[n].shape[1]:,} of the {expected_inputs[n]:,} positions verify compares")
    steps = set().union(*(s.keys() for s in runs["float64"].values()))
    if expected_steps - steps:
        notes.append(f"covers {len(expected_steps & steps)} of the {len(expected_steps)} steps verify compares "
                     f"(the first missing: {sorted(expected_steps - steps)[0]})")
    return notes
