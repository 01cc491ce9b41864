"""Seeded mutation fuzzing of the loaders: ``python fuzz.py WORKDIR CASES SEED [ONLY]``.

WORKDIR holds what test_fuzz.py puts there: ``safetensors/`` (a GPT-2 folder), ``llama/`` (a Llama
folder), ``model.gguf``, and optionally ``sharded/`` (a sharded safetensors folder) and
``model-q8_0.gguf`` (model.gguf's model with its matrices in Q8_0). ONLY: a comma-separated list
of case numbers to run alone (the others are still generated, so each case is the same as in the
full run): how a failure is reproduced.

Case classes, in turn:

- ``safetensors``, ``gguf``, ``config``, ``llama-config``: byte flips, truncations and length-field
  changes of a weights file, and wrong values, types and deletions in a config.json.
- ``special-file``: a side file of a checkpoint folder (config.json, the tokenizer files, the
  weights or a sharded folder's index or a shard), or the GGUF file itself, replaced by a FIFO, a
  link to /dev/zero, a link to nothing, a link to itself, a folder, random bytes, or a link to a file
  outside the folder (a secret): such a case is also exported, and nothing written may hold the secret.
- ``json-extreme``: a value of config.json, tokenizer_config.json, tokenizer.json or a shard index
  replaced by a list or object nested 500 … 200,000 deep, an integer or float of thousands of
  digits, or NaN / Infinity.
- ``gguf-array``: the count (u64) of one array in a GGUF file that carries a tokenizer (and a
  nested array) set to a hostile value (2^32, 2^40, 2^63-1, the file's length, …).
- ``tokenizer-code``: a tokenizer.json whose pre-tokenizer, normalizer or decoder runs a regex that
  backtracks past Oniguruma's limit (a Rust panic), and chat templates that loop, allocate, recurse,
  render without end or try to leave the sandbox, in a folder or a GGUF file.
- ``gguf-offsets``: offset arithmetic at 2^64, and other tensor tables llama.cpp refuses: one
  tensor's data offset set near 2^64 (GGUFReader's uint64 sum wraps it into the header), to a place
  inside another tensor's data, or swapped with another's; one tensor's type relabelled to one whose
  size no longer fits the data (F32 as BF16, Q8_0 as Q4_0, …). Each case must end in a one-line
  GptconvError naming the file, with no warning printed: a load is a failure.
- ``key-table``: a user's key table for ``gptconv.state_dict(folder, KeyMap)`` (GPT-2's HF rows) with
  its rows reordered or renamed (it must load, and give the unmutated table's tensors under the new
  names), or broken: one name for two tensors, two names for one, a field on one side, a stray brace, a
  target the model lacks, a row that is no row (it must end in a GptconvError, not in a state dict).

Cases of the four classes from special-file to tokenizer-code do not only load the model but also the
tokenizer, encode a text, decode the ids and render the chat template. Every case must end in a
GptconvError or a success,
within TIME_LIMIT seconds (a SIGALRM ends a case stuck in Python code: outcome "hang"; a watchdog
ends the run if one is stuck where no signal reaches), under an address-space limit. Prints a JSON
summary: per class, how many cases of each kind ended how.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

from fuzz_hostile import (ABSENT_SIDE_FILES, KEY_TABLE_KINDS, KEY_TABLE_ORDER, SECRET, SIDE_FILES, SPECIAL_KINDS,
                          TABLE_KINDS, TEMPLATES, TEXT, TOKENIZER_ORDER, base_tokenizer_json, build_table, costly,
                          extreme_literal, gguf_with_kvs, hostile_table, hostile_tokenizer_json, make_special,
                          mutate_array_count, mutate_tensor_table, put_raw, put_template, table_specs,
                          tensor_table, tokenizer_kvs)

TIME_LIMIT = 20.0
MEMORY_LIMIT = 8 << 30  # address space: a loader that tries to allocate a lie gets MemoryError, not the machine
NATIVE_LIMIT = TIME_LIMIT + 15  # a case still running then is stuck where SIGALRM cannot reach: the run ends
# gptconv cuts a chat template's rendering after chat_template.SECONDS (5 s); the fuzz lowers that to keep
# its looping templates cheap: the same deadline code runs, just sooner
TEMPLATE_SECONDS = 1.0

CLASSES = ("safetensors", "gguf", "config", "llama-config", "special-file", "json-extreme", "gguf-array",
           "tokenizer-code", "gguf-offsets", "key-table")
TOKENIZER_CLASSES = ("special-file", "json-extreme", "gguf-array", "tokenizer-code")  # they load a tokenizer too
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


# ---------------------------------------------------------------------------------------------------
# Byte and value mutations (the first four classes)

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


# ---------------------------------------------------------------------------------------------------
# Running a case

class CaseHang(BaseException):
    """SIGALRM: the case ran past TIME_LIMIT."""


def _alarm(signum, frame):
    raise CaseHang()


def one_case(label: str, run: Callable[[], object], named: tuple[str, ...], failures: list[str]) -> tuple[str, object]:
    """Run a case of fuzz_fields.py or fuzz_references.py in TIME_LIMIT: ("done", what ``run`` returned),
    ("error", None) for a GptconvError in one line naming one of ``named``, or "hang" / "other"; each
    way it went wrong added to ``failures``."""
    from gptconv.errors import GptconvError
    start, result = time.monotonic(), None
    try:
        signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT)
        result, outcome = run(), "done"
    except CaseHang:
        outcome = "hang"
        failures.append(f"{label}: did not end in {TIME_LIMIT:g}s")
    except GptconvError as e:
        outcome = "error"
        if "\n" in str(e) or not any(n in str(e) for n in named):
            failures.append(f"{label}: refused in more than one line or without naming the file: {e}")
    except BaseException as e:  # noqa: BLE001 - the point is to catch anything
        outcome = "other"
        failures.append(f"{label}: {type(e).__name__}: {str(e)[:300]}\n{traceback.format_exc(limit=-6)}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if time.monotonic() - start > TIME_LIMIT and outcome != "hang":
        failures.append(f"{label}: took {time.monotonic() - start:.1f}s")
    return outcome, result


def exercise(target: Path, text: str, tokenizer: bool, refusals: list[str] | None = None) -> tuple[str, list[str]]:
    """Load ``target``; with ``tokenizer`` also its tokenizer: encode ``text``, decode the ids, render the
    chat template. The outcome ("loaded": every step succeeded, "error": one ended in a GptconvError,
    "other": one raised anything else) and a description of each "other"; each GptconvError's message
    added to ``refusals``."""
    import gptconv
    from gptconv.errors import GptconvError
    outcome, problems = "loaded", []

    def attempt(step, fn):
        nonlocal outcome
        try:
            return fn(), True
        except CaseHang:
            raise
        except GptconvError as e:
            outcome = "error" if outcome == "loaded" else outcome
            if refusals is not None:
                refusals.append(str(e))
        except BaseException as e:  # noqa: BLE001 - the point is to catch anything
            outcome = "other"
            problems.append(f"{step}: {type(e).__name__}: {str(e)[:300]}\n{traceback.format_exc(limit=-6)}")
        return None, False

    attempt("load", lambda: gptconv.load(target))
    if tokenizer:
        tok, ok = attempt("load_tokenizer", lambda: gptconv.load_tokenizer(str(target)))
        if ok:
            ids, ok = attempt("encode", lambda: tok.encode(text))
            if ok:
                attempt("decode", lambda: tok.decode(ids))
            if tok.chat_template is not None:
                attempt("apply_chat_template", lambda: tok.apply_chat_template(MESSAGES))
    return outcome, problems


def leaked(target: Path, out: Path, fmt: str) -> list[str]:
    """Export ``target`` (whose side file links out of its folder) to ``out``: it may be refused, but no
    file written may hold what the link points at."""
    import gptconv
    from gptconv.errors import GptconvError
    out.mkdir(parents=True, exist_ok=True)
    try:
        gptconv.export(target, out / ("model.gguf" if fmt == "gguf" else "hf"), fmt)
    except GptconvError:
        pass
    except Exception as e:  # noqa: BLE001 - the point is to catch anything
        return [f"export: {type(e).__name__}: {str(e)[:300]}"]
    return [f"export to {fmt} wrote what a link out of the folder points at into {p.relative_to(out)}"
            for p in (out.rglob("*") if out.exists() else []) if p.is_file() and SECRET in p.read_bytes()]


def exercise_table(folder: Path, specs: list | None, expected: dict | None) -> tuple[str, list[str]]:
    """``gptconv.state_dict(folder, table)``, the table built from ``specs`` in the same step (its rows are
    checked as they are written). The outcome as ``exercise``'s; ``expected``: the state dict a valid table
    gives (a problem if it gives another, or fails), None where the table is broken (a problem if it loads:
    a state dict from a broken table has lost a tensor under a name, or holds one the model lacks)."""
    import torch

    import gptconv
    from gptconv.errors import GptconvError
    try:
        state = gptconv.state_dict(folder, layout=build_table(specs))
    except CaseHang:
        raise
    except GptconvError as e:
        return "error", [] if expected is None else [f"a valid table was refused: {e}"]
    except BaseException as e:  # noqa: BLE001 - the point is to catch anything
        return "other", [f"state_dict: {type(e).__name__}: {str(e)[:300]}\n{traceback.format_exc(limit=-6)}"]
    if expected is None:
        return "loaded", [f"a broken table loaded, as {len(state)} tensors: {sorted(state)[:6]}"]
    if state.keys() != expected.keys() or not all(torch.equal(state[k], v) for k, v in expected.items()):
        odd = sorted(state.keys() ^ expected.keys())[:6]
        return "loaded", [f"the state dict differs from the reference: {'keys ' + str(odd) if odd else 'tensors'}"]
    return "loaded", []


class Watchdog:
    """Ends the run when a case is stuck where SIGALRM cannot reach it (native code that never returns to
    Python): prints the result so far, with the stuck case as a failure, and every thread's stack."""

    def __init__(self, result: dict) -> None:
        self.result, self.current = result, None
        self.stderr = os.dup(2)  # gptconv holds fd 2 during tokenizer calls (tokenizer.rust_panics)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            current = self.current
            if current is not None and time.monotonic() - current[1] > NATIVE_LIMIT:
                message = (f"{current[0]}: still running after {NATIVE_LIMIT:.0f}s, out of SIGALRM's reach (hang) "
                           f"{current[2]}")
                self.result["failures"].append(message)
                self.result["aborted"] = True
                os.write(self.stderr, f"fuzz: {message}; its stacks:\n".encode())
                faulthandler.dump_traceback(file=self.stderr, all_threads=True)
                os.write(1, (json.dumps(self.result) + "\n").encode())
                os._exit(3)


def main(workdir: Path, cases: int, seed: int, only: set[int] | None = None) -> dict:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a mutated path must never turn into a download
    os.environ["RUST_BACKTRACE"] = "0"  # a panic (tokenizer-code) with no backtrace to resolve and print
    import gptconv.chat_template
    import jinja2.sandbox  # noqa: F401 - imported once here, not in each template's process (~20 ms a case)
    gptconv.chat_template.SECONDS = TEMPLATE_SECONDS
    rng = random.Random(seed)
    st_folder, gguf_file, llama_folder = workdir / "safetensors", workdir / "model.gguf", workdir / "llama"
    sharded = workdir / "sharded"
    folders = {"safetensors": st_folder, "llama": llama_folder, **({"sharded": sharded} if sharded.is_dir() else {})}
    originals = {"safetensors": (st_folder / "model.safetensors").read_bytes(),
                 "gguf": gguf_file.read_bytes(), "config": (st_folder / "config.json").read_text(),
                 "llama-config": (llama_folder / "config.json").read_text()}
    hot = {"safetensors": 8 + struct.unpack("<Q", originals["safetensors"][:8])[0], "gguf": 8192}
    tables = {"F32": (originals["gguf"], tensor_table(gguf_file))}  # gguf-offsets: the files and their tables
    if (workdir / "model-q8_0.gguf").is_file():
        tables["Q8_0"] = ((workdir / "model-q8_0.gguf").read_bytes(), tensor_table(workdir / "model-q8_0.gguf"))
    tokenizer_json = {name: base_tokenizer_json(folder) for name, folder in folders.items()}
    gguf_tok = gguf_with_kvs(originals["gguf"], tokenizer_kvs(llama_folder, TEMPLATES["template-ok"][0]))
    from gptconv.families.gpt2 import GPT2_HF
    base_table = table_specs(GPT2_HF.rules)  # HF's names as a user's table; its state dict, the reference
    reference = gptconv.state_dict(st_folder, layout=build_table(base_table))
    n_layers = gptconv.open_source(st_folder).config.n_layers
    summary: dict[str, dict[str, int]] = {}
    failures: list[str] = []
    seconds: dict[str, float] = {}  # per class, making and running its cases
    slowest: list[tuple[float, str]] = []  # the five slowest cases, what each took
    result = {"cases": cases, "seed": seed, "summary": summary, "failures": failures, "seconds": seconds,
              "slowest": slowest}
    watchdog = Watchdog(result)
    signal.signal(signal.SIGALRM, _alarm)

    def hf_case(case: Path) -> str:
        """A copy of one of the folders, with a tokenizer.json; its name."""
        name = rng.choice(sorted(folders))
        shutil.copytree(folders[name], case)
        (case / "tokenizer.json").write_text(tokenizer_json[name])
        return name

    for n in range(cases):
        cls, index = CLASSES[n % len(CLASSES)], n // len(CLASSES)  # index: the case's number in its class
        made = time.monotonic()
        case = workdir / f"case-{n}"
        if case.exists():  # left by a run the watchdog ended
            shutil.rmtree(case)
        text, tokenizer, detail, table = TEXT, cls in TOKENIZER_CLASSES, "", None
        if cls == "gguf":
            case.mkdir()
            data, kind = mutate(originals["gguf"], rng, hot["gguf"])
            target = case / "model.gguf"
            target.write_bytes(data)
        elif cls == "llama-config":
            shutil.copytree(llama_folder, case)
            data, kind = mutate_config(originals["llama-config"], rng)
            (case / "config.json").write_bytes(data)
            target = case
        elif cls in ("safetensors", "config"):
            shutil.copytree(st_folder, case)
            if cls == "safetensors":
                data, kind = mutate(originals["safetensors"], rng, hot["safetensors"])
                (case / "model.safetensors").write_bytes(data)
            else:
                data, kind = mutate_config(originals["config"], rng)
                (case / "config.json").write_bytes(data)
            target = case
        elif cls == "special-file":
            kind = rng.choice(SPECIAL_KINDS)
            if rng.random() < 0.15:  # the GGUF file itself
                case.mkdir()
                target = case / "model.gguf"
                make_special(target, kind, rng)
                detail = "model.gguf"
            else:
                name = hf_case(case)
                weights = sorted(p.name for p in case.glob("*.safetensors"))
                choices = [*SIDE_FILES, *SIDE_FILES, *ABSENT_SIDE_FILES] + (
                    ["model.safetensors.index.json"] * 3 + weights if name == "sharded" else ["model.safetensors"] * 2)
                victim = rng.choice(choices if kind != "outside" else [*ABSENT_SIDE_FILES, "tokenizer_config.json"])
                if victim in ("vocab.json", "merges.txt"):
                    (case / "tokenizer.json").unlink()  # else they are never read
                make_special(case / victim, kind, rng)
                target, detail = case, f"{name}/{victim}"
        elif cls == "json-extreme":
            name = hf_case(case)
            victim = rng.choice(["config.json", "config.json", "tokenizer_config.json", "tokenizer.json"]
                                + (["model.safetensors.index.json"] if name == "sharded" else []))
            kind, raw, size = extreme_literal(rng)
            data, place = put_raw((case / victim).read_text(), raw, rng)
            (case / victim).write_bytes(data)
            target, detail = case, f"{name}/{victim} at {place}: {size}"
        elif cls == "gguf-offsets":
            case.mkdir()
            kind, stored = TABLE_KINDS[index % len(TABLE_KINDS)], rng.choice(sorted(tables))
            data, detail = mutate_tensor_table(*tables[stored], kind, rng)
            detail = f"{stored} file: {detail}"
            target = case / "model.gguf"
            target.write_bytes(data)
        elif cls == "gguf-array":
            case.mkdir()
            data, kind, detail = mutate_array_count(gguf_tok, rng, costly("fits", index))
            target = case / "model.gguf"
            target.write_bytes(data)
        elif cls == "key-table":
            case.mkdir()  # left empty: the case is the table
            kind = KEY_TABLE_ORDER[index % len(KEY_TABLE_ORDER)]
            specs, rename, detail = hostile_table(base_table, kind, n_layers, rng)
            assert (rename is not None) == KEY_TABLE_KINDS[kind], kind
            table, target = (specs, rename(reference) if rename else None), st_folder
        else:  # tokenizer-code
            kind = next((k for k in ("template-loop", "template-double") if costly(k, index)),
                        TOKENIZER_ORDER[index % len(TOKENIZER_ORDER)])
            if kind.startswith("template-"):
                template = rng.choice(TEMPLATES[kind])
                if rng.random() < 0.25:  # in a GGUF file's tokenizer.chat_template
                    case.mkdir()
                    target = case / "model.gguf"
                    target.write_bytes(gguf_with_kvs(originals["gguf"], tokenizer_kvs(llama_folder, template)))
                    detail = f"model.gguf: {template[:60]!r}"
                else:
                    name = hf_case(case)
                    target, detail = case, f"{name}/{put_template(case, template, rng)}: {template[:60]!r}"
            else:
                name = hf_case(case)
                spec, text, detail = hostile_tokenizer_json(tokenizer_json[name], kind, rng)
                (case / "tokenizer.json").write_text(spec)
                target, detail = case, f"{name}/tokenizer.json: {detail}"
        if only is not None and n not in only:
            shutil.rmtree(case)
            continue
        label = f"case {n} ({cls}/{kind}{'; ' + detail if detail else ''})"
        rerun = f"(rerun alone: fuzz.py WORKDIR {cases} {seed} {n})"
        watchdog.current = (label, time.monotonic(), rerun)
        start = time.monotonic()
        refusals: list[str] = []
        try:
            signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT)
            # gguf-offsets: a warning (numpy's, on a wrapped offset) would be printed beside the one error line
            with warnings.catch_warnings(record=True) if cls == "gguf-offsets" else contextlib.nullcontext() as warned:
                if warned is not None:
                    warnings.simplefilter("always")
                outcome, problems = (exercise_table(target, *table) if table else
                                     exercise(target, text, tokenizer, refusals))
        except CaseHang:
            outcome, problems, warned = "hang", [f"did not end in {TIME_LIMIT:g}s (stopped by SIGALRM)\n"
                                                 f"{traceback.format_exc(limit=-8)}"], None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if cls == "special-file" and kind == "outside" and outcome != "hang":
            problems += leaked(target, case / "exported", rng.choice(["safetensors", "gguf"]))
        if cls == "gguf-offsets":  # a table llama.cpp refuses: one line naming the file, nothing else
            if outcome == "loaded":
                problems.append("loaded a tensor table that llama.cpp refuses")
            problems += [f"refused in more than one line, or without naming the file: {m[:300]!r}"
                         for m in refusals if "\n" in m or "model.gguf" not in m]
            problems += [f"printed {w.category.__name__}: {str(w.message)[:200]}" for w in warned or []]
        watchdog.current = None
        took = time.monotonic() - start
        if outcome != "hang" and took > TIME_LIMIT:
            problems.append(f"took {took:.1f}s")
        failures.extend(f"{label}: {p} {rerun}" for p in problems)
        summary.setdefault(cls, {}).setdefault(f"{kind}:{outcome}", 0)
        summary[cls][f"{kind}:{outcome}"] += 1
        shutil.rmtree(case)
        seconds[cls] = seconds.get(cls, 0.0) + time.monotonic() - made
        slowest.append((round(took, 2), label))
        slowest[:] = sorted(slowest, reverse=True)[:5]
    result["seconds"] = {cls: round(t, 2) for cls, t in seconds.items()}
    return result


if __name__ == "__main__":
    only = {int(x) for x in sys.argv[4].split(",")} if len(sys.argv) > 4 else None
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), only)))
