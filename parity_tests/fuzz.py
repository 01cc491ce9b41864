"""Seeded mutation fuzzing of the loaders: ``python fuzz.py WORKDIR CASES SEED``.

Mutates small valid files (a safetensors checkpoint, a GGUF file, a config.json) by byte flips,
truncations and length-field changes, and loads each with ``gptconv.load``. Every case must end in
a GptconvError or a successful load, within TIME_LIMIT seconds; anything else is reported. Prints a
JSON summary: per format, how many cases ended how.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import struct
import sys
import time
import traceback
from pathlib import Path

TIME_LIMIT = 20.0
MEMORY_LIMIT = 8 << 30  # address space: a loader that tries to allocate a lie gets MemoryError, not the machine


def mutate(data: bytes, rng: random.Random, hot: int) -> tuple[bytes, str]:
    """One mutation; ``hot``: how many leading bytes are header (mutated more often)."""
    kind = rng.choice(["flip", "flip", "truncate", "length", "splice"])
    b = bytearray(data)
    pick = lambda: rng.randrange(min(hot, len(b))) if rng.random() < 0.8 else rng.randrange(len(b))  # noqa: E731
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            b[pick()] = rng.randrange(256)
    elif kind == "truncate":
        b = b[: rng.randrange(len(b))]
    elif kind == "length":  # a little-endian u64 or u32 somewhere in the header set to a hostile value
        pos = pick() & ~3
        value = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, 2**40, 2**63 - 1, len(b), len(b) * 2])
        fmt = rng.choice(["<Q", "<I"])
        b[pos:pos + struct.calcsize(fmt)] = struct.pack(fmt, value % (1 << (8 * struct.calcsize(fmt))))
    else:  # a chunk of the file copied over another place
        a, c = pick(), pick()
        n = rng.randint(1, 64)
        b[c:c + n] = b[a:a + n]
    return bytes(b), kind


def mutate_config(text: str, rng: random.Random) -> tuple[bytes, str]:
    data = json.loads(text)
    kind = rng.choice(["value", "delete", "type", "bytes"])
    if isinstance(data.get("rope_parameters"), dict) and rng.random() < 0.3:
        data, inner = data, data["rope_parameters"]  # reach into the nested RoPE parameters too
        key = rng.choice(sorted(inner))
        inner[key] = rng.choice([0, -1.0, 1e308, "x", None, 2**63])
        return json.dumps(data).encode(), "rope"
    key = rng.choice(sorted(data))
    if kind == "value":
        data[key] = rng.choice([0, -1, 10**12, 2**63, 1.5, 1e308])
    elif kind == "delete":
        del data[key]
    elif kind == "type":
        data[key] = rng.choice(["x", None, [], {}, True, [1, 2]])
    else:
        raw, _ = mutate(json.dumps(data).encode(), rng, 10**6)
        return raw, "bytes"
    return json.dumps(data).encode(), kind


def main(workdir: Path, cases: int, seed: int) -> dict:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    import gptconv
    from gptconv.errors import GptconvError
    rng = random.Random(seed)
    st_folder, gguf_file, llama_folder = workdir / "safetensors", workdir / "model.gguf", workdir / "llama"
    originals = {"safetensors": (st_folder / "model.safetensors").read_bytes(),
                 "gguf": gguf_file.read_bytes(), "config": (st_folder / "config.json").read_text(),
                 "llama-config": (llama_folder / "config.json").read_text()}
    hot = {"safetensors": 8 + struct.unpack("<Q", originals["safetensors"][:8])[0], "gguf": 8192}
    summary: dict[str, dict[str, int]] = {}
    failures = []
    for n in range(cases):
        fmt = ("safetensors", "gguf", "config", "llama-config")[n % 4]
        case = workdir / f"case-{n}"
        if fmt == "gguf":
            case.mkdir()
            data, kind = mutate(originals["gguf"], rng, hot["gguf"])
            target = case / "model.gguf"
            target.write_bytes(data)
        elif fmt == "llama-config":
            shutil.copytree(llama_folder, case)
            data, kind = mutate_config(originals["llama-config"], rng)
            (case / "config.json").write_bytes(data)
            target = case
        else:
            shutil.copytree(st_folder, case)
            if fmt == "safetensors":
                data, kind = mutate(originals["safetensors"], rng, hot["safetensors"])
                (case / "model.safetensors").write_bytes(data)
            else:
                data, kind = mutate_config(originals["config"], rng)
                (case / "config.json").write_bytes(data)
            target = case
        start = time.monotonic()
        try:
            model = gptconv.load(target)
            outcome = "loaded"
            del model
        except GptconvError:
            outcome = "error"
        except BaseException as e:  # noqa: BLE001 - the point is to catch anything
            outcome = "other"
            failures.append(f"case {n} ({fmt}/{kind}): {type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
        if time.monotonic() - start > TIME_LIMIT:
            failures.append(f"case {n} ({fmt}/{kind}) took {time.monotonic() - start:.1f}s")
        summary.setdefault(fmt, {}).setdefault(f"{kind}:{outcome}", 0)
        summary[fmt][f"{kind}:{outcome}"] += 1
        shutil.rmtree(case)
    return {"cases": cases, "seed": seed, "summary": summary, "failures": failures}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))))
