"""Every numeric metadata field of each family's GGUF file set to hostile values: ``python fuzz_fields.py
WORKDIR FILE...``. Each case is a copy of one FILE with one ``{arch}.*`` field (a scalar, or every item of
an array) set to 0, to a number past any real model's, to -1 or NaN where the type holds them, or a bool
flipped; ``gptconv.trace`` then runs it on two tokens. Every case must end in a GptconvError or a trace,
in bounded time and memory (fuzz.py's limits). Prints a JSON summary: cases, outcomes, failures."""

from __future__ import annotations

import json
import math
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from fuzz import MEMORY_LIMIT, TIME_LIMIT, CaseHang, _alarm

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


def patch(data: bytes, dst: Path, places: list[tuple[int, np.ndarray]], value) -> None:
    b = bytearray(data)
    for at, item in places:
        new = ~item if value == "flip" else np.full_like(item, value)
        b[at:at + new.nbytes] = new.tobytes()
    dst.write_bytes(bytes(b))


def main(workdir: Path, files: list[Path]) -> dict:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    import gptconv
    from gptconv.errors import GptconvError
    signal.signal(signal.SIGALRM, _alarm)
    summary: dict[str, int] = {}
    failures: list[str] = []
    for src in files:
        data = src.read_bytes()
        for key, value, places in cases(src):
            target = workdir / src.name
            patch(data, target, places, value)
            label = f"{src.name}: {key} = {value}"
            start = time.monotonic()
            try:
                signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT)
                gptconv.trace(target, ids=[1, 2])
                outcome = "traced"
            except CaseHang:
                outcome = "hang"
                failures.append(f"{label}: did not end in {TIME_LIMIT:g}s")
            except GptconvError as e:
                outcome = "error"
                if "\n" in str(e) or src.name not in str(e):
                    failures.append(f"{label}: refused in more than one line or without naming the file: {e}")
            except BaseException as e:  # noqa: BLE001 - the point is to catch anything
                outcome = "other"
                failures.append(f"{label}: {type(e).__name__}: {str(e)[:300]}\n{traceback.format_exc(limit=-6)}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if time.monotonic() - start > TIME_LIMIT and outcome != "hang":
                failures.append(f"{label}: took {time.monotonic() - start:.1f}s")
            summary[outcome] = summary.get(outcome, 0) + 1
            target.unlink()
    return {"summary": summary, "failures": failures}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])))
