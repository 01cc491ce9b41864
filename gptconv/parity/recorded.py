"""A recorded reference: transformers' outputs on the parity inputs, saved by ``gptconv reference``
(safetensors) for a later ``verify --reference`` on a machine without transformers."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import where
from ..output import atomic_output
from ..sources.files import UNLIMITED, regular_file

FORMAT = "2"  # 2: with the float64 run every verdict is calibrated by; 1 had none
Runs = dict[str, dict[str, dict[str, torch.Tensor]]]  # dtype name → input name → step → tensor


def save_reference(path: Path, runs: Runs, inputs: dict[str, torch.Tensor], meta: dict[str, str],
                   force: bool = False) -> None:
    """Keys: ``input/ids``, ``input/step`` (the float32 run) and ``input/dtype/step`` (another run:
    float64, the truth, and float16 / bfloat16)."""
    tensors = {f"{name}/ids": ids.contiguous() for name, ids in inputs.items()}
    for run, records in runs.items():
        prefix = "" if run == "float32" else f"{run}/"
        for name, steps in records.items():
            tensors.update({f"{name}/{prefix}{step}": t.contiguous() for step, t in steps.items()})
    meta = {**meta, "gptconv_reference": FORMAT, "inputs": json.dumps(list(inputs))}
    with atomic_output(path, force) as tmp:
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

