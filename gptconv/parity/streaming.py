"""Running a model with one block's weights in memory at a time.

For a checkpoint larger than memory allows twice (verify holds our model and the reference), each
block (a transformer layer) gets its parameters read from the checkpoint just before it runs and
dropped right after; the parameters outside the blocks (embeddings, final norm, head) stay loaded.
Peak memory is those, one block, and the activations, whatever the depth. Works on any
``nn.Module`` built on the meta device: ours and transformers' alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

ReadWeight = Callable[[str], torch.Tensor]  # parameter name (as the model names it) → its tensor


def fill_blockwise(model: nn.Module, blocks: list[str], weights: ReadWeight) -> nn.Module:
    """Fill ``model``'s parameters outside ``blocks`` now, and each block's as it runs.

    ``model`` is on the meta device; ``blocks`` are submodule names (``model.layers.3``);
    ``weights(name)`` reads one parameter. Parameters shared by several names (a tied head) are
    read once and stay shared.
    """
    names: dict[int, list[str]] = {}  # one parameter → every name it has
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    inside = {name for block in blocks for name, _ in model.get_submodule(block).named_parameters(prefix=block)}
    for group in names.values():
        if not inside & set(group):
            _assign(model, group, weights(group[0]))
    for block in blocks:
        module = model.get_submodule(block)
        own = [(n, f"{block}.{n}") for n, _ in module.named_parameters()]

        def fill(m: nn.Module, _args, own=own) -> None:
            for local, full in own:
                _assign(m, [local], weights(full))

        def drop(m: nn.Module, _args, _out, own=own) -> None:
            for local, _ in own:
                p = m.get_parameter(local)
                _assign(m, [local], torch.empty(p.shape, dtype=p.dtype, device="meta"))
        module.register_forward_pre_hook(fill)
        module.register_forward_hook(drop)
    return model


def _assign(root: nn.Module, names: list[str], tensor: torch.Tensor) -> None:
    p = nn.Parameter(tensor, requires_grad=False)
    for name in names:
        owner, _, leaf = name.rpartition(".")
        root.get_submodule(owner)._parameters[leaf] = p
