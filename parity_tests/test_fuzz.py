"""Seeded mutation fuzz of the loaders: every case ends in our error or a load, in bounded time and memory.

The cases (fuzz.py) are byte and value mutations of weights, GGUF files and configs; side files that are
FIFOs, links to /dev/zero or to nothing, or folders; JSON nested 200,000 deep or with 5,000-digit numbers;
GGUF arrays with hostile counts; tokenizers whose regexes make the Rust library panic and chat templates
that loop or allocate (those cases also encode, decode and render); GGUF tensor tables llama.cpp refuses
(offsets near 2^64, overlapping or swapped offsets, relabelled types), which must end in our error;
users' key tables for state_dict, reordered or renamed (they must load, as the unmutated table does) or
broken (they must be refused).

CI runs FUZZ_CASES (300); set GPTCONV_FUZZ_CASES for more, e.g. GPTCONV_FUZZ_CASES=5000 make test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gguf import GGMLQuantizationType

from test_gguf_errors import write_llama_gguf

FUZZ_CASES = int(os.environ.get("GPTCONV_FUZZ_CASES", "300"))


def test_mutated_files_never_crash(ckpts, llamas, tmp_path):
    shutil.copytree(ckpts["tiny"], tmp_path / "safetensors")
    shutil.copytree(ckpts["tiny-sharded"], tmp_path / "sharded")
    shutil.copytree(llamas["llama31-scaled"], tmp_path / "llama")
    write_llama_gguf(tmp_path / "model.gguf", n_layers=2)
    write_llama_gguf(tmp_path / "model-q8_0.gguf", n_layers=2, quant=GGMLQuantizationType.Q8_0)
    script = Path(__file__).with_name("fuzz.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path), str(FUZZ_CASES), "1234"],
                       capture_output=True, text=True, timeout=60 + FUZZ_CASES * 5)
    lines = r.stdout.strip().splitlines()
    # a crash of the interpreter (segfault, abort) leaves no result; the watchdog's abort for a hang leaves one
    assert lines and lines[-1].startswith("{"), f"exit status {r.returncode}:\n{r.stderr[-3000:]}"
    result = json.loads(lines[-1])
    print("\nfuzz:", json.dumps(result["summary"], indent=1, sort_keys=True))
    assert result["failures"] == [], (f"{len(result['failures'])} failures (workdir {tmp_path}):\n"
                                      + "\n".join(result["failures"][:5]))
    assert r.returncode == 0, r.stderr[-3000:]
    outcomes = [k.split(":")[1] for per in result["summary"].values() for k in per]
    assert "error" in outcomes and "loaded" in outcomes  # the mutations both break files and leave some loadable
