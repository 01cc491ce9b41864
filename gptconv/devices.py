"""Where a model runs: ``cpu``, ``cuda`` (``cuda:N``), ``mps``, or ``auto`` (the first of cuda, mps, cpu
that torch can use). A device torch cannot use here is one error line, before anything is loaded."""

from __future__ import annotations

import torch

from .errors import GptconvError

CHOICES = "cpu, cuda, cuda:N, mps or auto"


def parse_device(name: str | torch.device) -> torch.device:
    if isinstance(name, torch.device):
        return name
    text = str(name).strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if torch.backends.mps.is_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise GptconvError(f"--device {name}: choose {CHOICES}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise GptconvError(f"--device {name}: torch sees no CUDA device here (torch {torch.__version__})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise GptconvError(f"--device {name}: there are {torch.cuda.device_count()} CUDA devices")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise GptconvError(f"--device {name}: torch sees no Apple GPU (MPS) here")
    elif device.type != "cpu" or device.index not in (None, 0):  # one CPU device: cpu:1 names nothing
        raise GptconvError(f"--device {name}: choose {CHOICES}")
    return device
