"""verify's runs in lockstep: every input through one step of one model at a time.

Each model (the float64 truth, the reference in our dtype, ours) runs each input in a lane of its own
(``gptconv.streaming.Lane``); the lanes advance a step at a time, model after model: every lane of the
truth to its next step, then every lane of the reference, then ours. So a streamed model's block is
read once for all the inputs and given back as soon as its last lane has passed it (one block of one
model in memory at a time), and each step's outputs are compared as soon as they exist and dropped
(``compare.Calibrated`` keeps running sums): only the truth's outputs of the step in hand are held.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..streaming import Lane, Streamed, model_device, stop_here, trim
from .compare import OURS_RUN
from .hf_reference import install_stops


@dataclass
class Run:
    """One model of a verify. ``forward(ids)`` returns its logits and, run in a lane, stops at each
    step it is to hand over (through a tap or a module hook); ``streamed``: its weights, where they
    are read as it runs; ``blocks``: a block's output step ("block.3") → that block's module, given
    back once every lane has passed it."""

    role: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    streamed: Streamed | None = None
    blocks: dict[str, str] = field(default_factory=dict)


def lockstep(runs: list[Run], inputs: dict[str, torch.Tensor],
             take: Callable[[str, Run, str, torch.Tensor], None],
             on_step: Callable[[str], None] = lambda step: None) -> dict[str, float]:
    """Run every model of ``runs`` on every input, step by step; ``take(step, run, input name, tensor)``
    gets each output as it exists (the runs in their order, the inputs in theirs), ``on_step(step)``
    once a step is done by all. The last step is ``logits``. Returns where the time went: each run's
    computing (its role), "reading" (filling streamed blocks) and "comparing" (``take``), in seconds."""
    lanes = [[Lane(functools.partial(run.forward, ids), f"{run.role}/{name}") for name, ids in inputs.items()]
             for run in runs]
    seconds = {run.role: 0.0 for run in runs} | {"comparing": 0.0}
    try:
        while True:
            step = None
            for run, row in zip(runs, lanes):
                for name, lane in zip(inputs, row):
                    start = time.perf_counter()
                    got, tensor = lane.next()
                    middle = time.perf_counter()
                    if step is None:
                        step = got
                    elif got != step:
                        raise RuntimeError(f"the runs part: {run.role} on '{name}' gives step '{got}' where "
                                           f"{runs[0].role} gave '{step}'")
                    take(step, run, name, tensor)
                    del tensor
                    seconds[run.role] += middle - start
                    seconds["comparing"] += time.perf_counter() - middle
                block = run.blocks.get(step)
                if run.streamed is not None and block is not None:
                    run.streamed.empty(block)
                trim()
            on_step(step)
            if step == "logits":
                reading = sum(run.streamed.seconds for run in runs if run.streamed is not None)
                for run in runs:  # a run's time less its reading
                    seconds[run.role] -= run.streamed.seconds if run.streamed is not None else 0.0
                return seconds | {"reading": reading}
    finally:
        for row in lanes:
            for lane in row:
                lane.close()


def expand(taps: dict[str, str], n_layers: int) -> dict[str, str]:
    """Each step name (``block.{i}`` for every layer) → its module name."""
    return {step.format(i=i): module.format(i=i) for step, module in taps.items()
            for i in (range(n_layers) if "{i}" in step else [0])}


def reference_run(hf: nn.Module, role: str, src, taps: dict[str, str]) -> Run:
    """transformers' model as a run of a verify: stopping at each step's module (``install_stops``)."""
    install_stops(hf, taps, src.config.n_layers)
    blocks = {step: module for step, module in expand(taps, src.config.n_layers).items() if step.count(".") == 1}
    device = model_device(hf)
    return Run(role, lambda ids: hf(ids.to(device), use_cache=False).logits, getattr(hf, "streamed", None), blocks)


def our_run(model: nn.Module, wanted: set[str], role: str = OURS_RUN) -> Run:
    """Our model as a run of a verify: its tap stops at the ``wanted`` steps (not at the logits, which it
    returns) and, where the model is streamed, at every block's output too, so that each block is given
    back once every lane has passed it (without those stops a lane would run to the logits holding every
    block it read)."""
    device = model_device(model)
    streamed = getattr(model, "streamed", None)
    blocks = {f"block.{i}": f"blocks.{i}" for i in range(model.config.n_layers)}
    stops = (set(wanted) | (set(blocks) if streamed is not None else set())) - {"logits"}

    def tap(step: str, x: torch.Tensor) -> None:
        if step in stops:
            stop_here(step, x)
    return Run(role, lambda ids: model(ids.to(device), tap=tap), streamed, blocks)


def kept(t: torch.Tensor) -> torch.Tensor:
    """A step's output as compared: on the CPU, in float64 from a float64 model, else in float32."""
    return t.detach().cpu() if t.dtype == torch.float64 else t.detach().float().cpu()
