"""Seeded mutation fuzz of the loaders: every case ends in our error or a load, in bounded time and memory.

CI runs FUZZ_CASES (300); set GPTCONV_FUZZ_CASES for more, e.g. GPTCONV_FUZZ_CASES=5000 make test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_gguf_errors import write_llama_gguf

FUZZ_CASES = int(os.environ.get("GPTCONV_FUZZ_CASES", "300"))


def test_mutated_files_never_crash(ckpts, llamas, tmp_path):
    shutil.copytree(ckpts["tiny"], tmp_path / "safetensors")
    shutil.copytree(llamas["llama31-scaled"], tmp_path / "llama")
    write_llama_gguf(tmp_path / "model.gguf", n_layers=2)
    script = Path(__file__).with_name("fuzz.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path), str(FUZZ_CASES), "1234"],
                       capture_output=True, text=True, timeout=60 + FUZZ_CASES * 5)
    assert r.returncode == 0, r.stderr[-3000:]  # a crash of the interpreter (segfault, abort) fails here
    result = json.loads(r.stdout.strip().splitlines()[-1])
    print("\nfuzz:", json.dumps(result["summary"], indent=1, sort_keys=True))
    assert result["failures"] == [], "\n".join(result["failures"][:5])
    outcomes = [k.split(":")[1] for per in result["summary"].values() for k in per]
    assert "error" in outcomes and "loaded" in outcomes  # the mutations both break files and leave some loadable
