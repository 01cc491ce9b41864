"""An export killed with SIGKILL mid-write: the destination keeps its old file (or stays absent), the rerun works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import run_cli


def _kill_mid_write(source, out, fmt: str) -> None:
    """Start an export and SIGKILL it once its temporary output holds some bytes but is not complete."""
    p = subprocess.Popen([sys.executable, "-m", "gptconv", "export", str(source), "--format", fmt, "-o", str(out),
                          "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = out.with_name(f".{out.name}.partial-{p.pid}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        written = sum(f.stat().st_size for f in partial.rglob("*")) if partial.is_dir() else (
            partial.stat().st_size if partial.exists() else 0)
        if written > 20_000_000:
            break
        time.sleep(0.005)
    assert p.poll() is None, "the export ended before it could be killed mid-write"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert partial.exists()  # it really was killed mid-write: its temporary output is still there


@pytest.mark.parametrize("fmt,name", [("gguf", "model.gguf"), ("safetensors", "model-hf")])
def test_sigkill_mid_export_keeps_the_old_output(gpt2_124m, tmp_path, fmt, name):
    out = tmp_path / name
    assert run_cli("export", gpt2_124m, "--format", fmt, "--dtype", "f16", "-o", out).returncode == 0
    before = {f.relative_to(out).as_posix(): f.read_bytes() for f in out.rglob("*")} if out.is_dir() else out.read_bytes()

    _kill_mid_write(gpt2_124m, out, fmt)  # an f32 export over the f16 one
    after = {f.relative_to(out).as_posix(): f.read_bytes() for f in out.rglob("*")} if out.is_dir() else out.read_bytes()
    assert after == before  # the old output, intact

    r = run_cli("export", gpt2_124m, "--format", fmt, "-o", out, "--force")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # the killed run's leftovers are gone
    import gptconv
    assert gptconv.load(out).config.n_layers == 12


def test_sigkill_mid_export_leaves_no_file_at_the_destination(gpt2_124m, tmp_path):
    out = tmp_path / "model.gguf"
    _kill_mid_write(gpt2_124m, out, "gguf")
    assert not out.exists()
    r = run_cli("export", gpt2_124m, "--format", "gguf", "-o", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
