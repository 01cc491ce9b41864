"""The benchmark runs end to end on a tiny model (its numbers are not checked here: they are
ratios against peers measured in the same run, which `make bench` prints)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from gptconv.bench.__main__ import bench_outputs, bench_running, facts, table
from gptconv.writers import export


@pytest.fixture(scope="module")
def tiny(converter_fixtures, tmp_path_factory):
    """A tiny GPT-2 with GPT-2's tokenizer, which llama.cpp's converter takes, and the GGUFs llama.cpp runs."""
    folder = tmp_path_factory.mktemp("bench") / "tiny"
    shutil.copytree(converter_fixtures["gpt2"], folder)
    export(str(folder), folder / "model-f32.gguf", "gguf", "f32")
    export(str(folder), folder / "model-bf16.gguf", "gguf", "bf16")
    return folder


def test_every_running_case_runs_and_reports(tiny):
    """The cases of ``bench_model`` that run the model (``bench_running``; the others: the next test)."""
    rows = bench_running("tiny", tiny, facts(tiny), repeat=1, bandwidth=10e9)
    assert [r.case for r in rows] == [
        "load to a ready model", "prefill T=64 float32", "prefill T=64 bfloat16", "prefill T=64 fp32 vs llama.cpp",
        "decode 48 greedy, fp32 (tok/s)", "decode vs llama.cpp, F32 GGUF (tok/s)", "decode / memory-bandwidth bound",
        "decode bf16 vs our fp32 (tok/s)", "decode bf16 vs llama.cpp, BF16 GGUF (tok/s)"]
    assert all(r.ours > 0 and (r.peer is None or r.peer > 0) for r in rows)
    assert rows[4].note == "same tokens as transformers"  # greedy decoding agrees with the peer's
    assert "| decode 48 greedy" in table(rows)


def test_every_output_case_runs_and_reports(tiny):
    """The cases of ``bench_model`` that write and verify it (``bench_outputs``), its exports cleaned up."""
    rows = bench_outputs("tiny", tiny, facts(tiny), repeat=1)
    assert [r.case for r in rows] == [
        "export gguf f16: time vs cp", "export gguf f16: peak RSS", "export safetensors f32: time vs cp",
        "export safetensors f32: peak RSS", "export GGUF f16 vs llama.cpp's convert_hf_to_gguf.py, whole process",
        "verify: peak RSS / model bytes"]
    assert all(r.ours > 0 and (r.peer is None or r.peer > 0) for r in rows)
    assert "passed" in rows[-1].note
    assert sorted(p.name for p in tiny.parent.iterdir()) == ["tiny"]  # the exports were cleaned up


def test_moe_bench_runs():
    """``python -m gptconv.bench.moe`` at tiny sizes: every row, both dtypes, the same bits (its times are not
    checked: they are ratios against the old loop in the same run)."""
    r = subprocess.run([sys.executable, "-m", "gptconv.bench.moe", "--d-model", "16", "--d-ff", "8", "--tokens",
                        "1,5", "--steps", "2", "--rounds", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line.split(" | ") for line in r.stdout.splitlines() if line.startswith(("| prefill", "| decode"))]
    assert [(row[0], row[1]) for row in rows] == [(f"| {case}", dtype) for dtype in ("float32", "bfloat16")
                                                  for case in ("prefill T=1", "prefill T=5", "decode T=1, 2 steps")]
    assert all(row[-1] == "yes |" for row in rows)
