"""Every numeric field of each family's config set to hostile values, both ways: ``python fuzz_fields.py
WORKDIR SOURCE...``, a SOURCE a GGUF file or an HF folder. A GGUF case is a copy of the file with one
``{arch}.*`` metadata field (a scalar, or every item of an array) changed; an HF case is the folder (its
other files hard links) with one number of its config.json changed (a leaf, nested ones included, or every
item of a list of numbers), and, in an FP8 or MXFP4 checkpoint, one scale tensor's values, shape or
dtype changed or the tensor left out. The values: 0, a number past any real model's, -1 or NaN where the type holds
them, or a bool flipped; ``gptconv.trace`` then runs the case on two tokens. Every case must end in a
GptconvError naming the file, in one line, or a trace, in bounded time and memory (fuzz.py's limits).
Prints a JSON summary: cases, outcomes, failures."""

from __future__ import annotations

import json
import math
import resource
import signal
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from fuzz import MEMORY_LIMIT, _alarm, one_case

UNSIGNED = {GGUFValueType.UINT8: 8, GGUFValueType.UINT16: 16, GGUFValueType.UINT32: 32, GGUFValueType.UINT64: 64}
SIGNED = (GGUFValueType.INT8, GGUFValueType.INT16, GGUFValueType.INT32, GGUFValueType.INT64)
FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)


def hostile_values(kind: GGUFValueType) -> list:
    if kind in UNSIGNED:
        return [0, 2**31 - 1, 2 ** UNSIGNED[kind] - 1]
    if kind in SIGNED:
        return [0, -1, 2**31 - 1]
    if kind in FLOATS:
        return [0.0, -1.0, math.nan, math.inf, 1e30]
    if kind == GGUFValueType.BOOL:
        return ["flip"]
    return []


def cases(path: Path) -> list[tuple[str, object, list[tuple[int, np.ndarray]]]]:
    """(key, hostile value, where its items lie: each one's byte offset and its bytes as stored), read once:
    gguf's reader takes seconds to walk a 50,257-token vocabulary, so a case is patched bytes, not a reread."""
    reader = GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    base = reader.data.ctypes.data
    out = []
    for key, field in reader.fields.items():
        if key.startswith(arch + "."):
            places = [(field.parts[i].ctypes.data - base, np.array(field.parts[i])) for i in field.data]
            out += [(key, value, places) for value in hostile_values(field.types[-1])]
    return out


def config_cases(config: dict) -> list[tuple[str, object, tuple]]:
    """(the field's name, hostile value, its path in config.json) for each number, bool or list of numbers."""
    out = []

    def walk(node, path):
        items = node.items() if isinstance(node, dict) else ()
        for key, v in items:
            here = (*path, key)
            name = ".".join(map(str, here))
            if isinstance(v, dict):
                walk(v, here)
            elif isinstance(v, bool):
                out.append((name, "flip", here))
            elif isinstance(v, (int, float)) or (isinstance(v, list) and v and
                                                 all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
                floats = isinstance(v, float) or (isinstance(v, list) and any(isinstance(x, float) for x in v))
                values = [0.0, -1.0, math.nan, math.inf, 1e30] if floats else [0, -1, 2**31 - 1, 2**64 - 1]
                out.extend((name, value, here) for value in values)
    walk(config, ())
    return out


def config_case(src: Path, dst: Path, config: dict, path: tuple, value) -> None:
    """``dst``: ``src`` with its files hard-linked and config.json's ``path`` set to ``value``."""
    import copy
    if dst.exists():
        for f in dst.iterdir():
            f.unlink()
    else:
        dst.mkdir()
    for f in src.iterdir():
        if f.name != "config.json" and f.is_file() or config is None and f.is_file():
            (dst / f.name).hardlink_to(f)
    if config is None:  # every file as it is
        return
    new = copy.deepcopy(config)
    node = new
    for key in path[:-1]:
        node = node[key]
    old = node[path[-1]]
    node[path[-1]] = (not old if value == "flip" else [value] * len(old) if isinstance(old, list) else value)
    (dst / "config.json").write_text(json.dumps(new))


SCALES = {"fp8": "_scale_inv", "mxfp4": "_scales"}  # a quantized checkpoint's scale tensors end so


def scale_cases(config: dict) -> list[tuple[str, object]]:
    """(what is done to one scale tensor, how) for a checkpoint whose config.json says it is FP8 or MXFP4:
    its values hostile (an MXFP4 scale is a uint8 exponent, 255 its NaN), its shape cut, turned, flattened
    or grown, its dtype another, or the tensor gone."""
    import torch
    method = (config.get("quantization_config") or {}).get("quant_method")
    if method not in SCALES:
        return []
    values = [0, 1, 127, 254, 255] if method == "mxfp4" else [0.0, -1.0, math.nan, math.inf, 1e30, 1e-45]
    return ([(f"values {v}", lambda t, v=v: torch.full_like(t, v)) for v in values] + [
        ("a row fewer", lambda t: t[:-1].clone()), ("transposed", lambda t: t.transpose(-1, -2).contiguous()),
        ("flattened", lambda t: t.reshape(-1).clone()), ("a dimension more", lambda t: t[None].clone()),
        ("as int32", lambda t: t.to(torch.int32)), ("as float16", lambda t: t.to(torch.float16)),
        ("as bfloat16", lambda t: t.to(torch.bfloat16)), ("gone", None)])


def scale_case(src: Path, dst: Path, tensors: dict, name: str, how) -> None:
    """``dst``: ``src`` with its files hard-linked but model.safetensors, written with ``name`` changed by
    ``how`` (or left out where ``how`` is None)."""
    from safetensors.torch import save_file
    config_case(src, dst, None, (), None)
    (dst / "model.safetensors").unlink()
    out = {k: (how(t) if k == name else t) for k, t in tensors.items() if k != name or how is not None}
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})


def all_cases(workdir: Path, src: Path):
    """(label, the file a refusal must name, a function making the case and returning what to trace)."""
    if src.is_dir():
        config = json.loads((src / "config.json").read_text())
        dst = workdir / src.name
        for name, value, path in config_cases(config):
            yield (f"{src.name}/config.json: {name} = {value}", "config.json",
                   lambda path=path, value=value: config_case(src, dst, config, path, value) or dst)
        if quantized := scale_cases(config):
            from safetensors.torch import load_file
            tensors = load_file(str(src / "model.safetensors"))
            name = next(k for k in tensors if k.endswith(SCALES[config["quantization_config"]["quant_method"]]))
            for what, how in quantized:
                yield (f"{src.name}: {name} {what}", src.name,
                       lambda how=how: scale_case(src, dst, tensors, name, how) or dst)
    else:
        data = src.read_bytes()
        target = workdir / src.name
        for key, value, places in cases(src):
            yield (f"{src.name}: {key} = {value}", src.name,
                   lambda places=places, value=value: patch(data, target, places, value) or target)


def patch(data: bytes, dst: Path, places: list[tuple[int, np.ndarray]], value) -> None:
    b = bytearray(data)
    for at, item in places:
        new = ~item if value == "flip" else np.full_like(item, value)
        b[at:at + new.nbytes] = new.tobytes()
    dst.write_bytes(bytes(b))


def main(workdir: Path, files: list[Path]) -> dict:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    import gptconv
    signal.signal(signal.SIGALRM, _alarm)
    summary: dict[str, int] = {}
    failures: list[str] = []
    for src in files:
        for label, named, make in all_cases(workdir, src):
            target = make()
            outcome, _ = one_case(label, lambda: gptconv.trace(target, ids=[1, 2]), (named, str(target)), failures)
            outcome = "traced" if outcome == "done" else outcome
            summary[outcome] = summary.get(outcome, 0) + 1
    return {"summary": summary, "failures": failures}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])))
