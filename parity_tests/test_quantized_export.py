"""GGUF export in llama.cpp's quantized types, made by llama.cpp's own quantizer from the f32 file we
write: the same file as llama_model_quantize run by hand, loadable here and in llama.cpp."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gptconv
import llama_cpp_tools
from gptconv import llamacpp
from gptconv.writers import export
from helpers import run_cli


@pytest.mark.parametrize("name,dtype", [("qwen3", "q4_0"), ("phi3", "q4_1"), ("mistral-swa", "q5_0"),
                                        ("qwen3", "q5_1"), ("mixtral", "q8_0"), ("qwen3", "q4_k_m"),
                                        ("qwen3", "q6_k"), ("mixtral", "q3_k_s"), ("mixtral", "q5_k_m"),
                                        ("qwen3", "q2_k"), ("phi3", "q3_k_m"), ("mistral-swa", "q3_k_l"),
                                        ("qwen3", "q4_k_s"), ("mixtral", "q5_k_s"),
                                        ("qwen3-bf16", "q4_k_m"), ("phi3-bf16", "q5_k_m")])
def test_equals_llama_cpps_quantizer_by_hand_and_runs(wide_families, tmp_path, monkeypatch, name, dtype):
    """q8_0 is ours (gguf.quants, streamed), the rest llama.cpp's quantizer run on our f32 file: either way
    the file is byte for byte what llama-quantize makes of that f32 file."""
    (tmp_path / "ours").mkdir()
    (tmp_path / "hand").mkdir()
    source = wide_families[name.removesuffix("-bf16")]
    if name.endswith("-bf16"):  # a bf16 checkpoint: quantized from a bf16 intermediate, half an f32 one
        source = export(str(source), tmp_path / "bf16", "safetensors", "bf16").out
    read = []  # what llama.cpp's quantizer is given
    quantize = llamacpp.quantize_file
    monkeypatch.setattr(llamacpp, "quantize_file", lambda path, out, ftype: (read.append(path.name), quantize(path, out, ftype)))
    summary = export(str(source), tmp_path / "ours" / "m.gguf", "gguf", dtype)
    assert read == ([] if dtype == "q8_0" else [f".m.gguf.partial-{os.getpid()}.{'bf16' if name.endswith('-bf16') else 'f32'}"])
    f32 = export(str(source), tmp_path / "hand" / "m.f32.gguf", "gguf", "f32").out
    hand = llama_cpp_tools.quantize(f32, tmp_path / "hand" / "m.gguf", dtype.upper())
    keys, tensors = llama_cpp_tools.differences(summary.out, hand)
    assert tensors == [] and set(keys) <= {"general.name"}, (keys, tensors)
    print(f"\n{name} {dtype}: {summary.tensor_types}")
    assert sum(summary.tensor_types.values()) == len(gptconv.open_source(summary.out).tensors)
    why = {c.tensor: (c.type, c.why) for c in summary.tensor_choices}
    assert len(why) == len(summary.tensor_choices) == sum(summary.tensor_types.values())
    assert why["blk.0.attn_norm.weight"] == ("F32", "1-D (a norm or bias): kept F32")
    if name == "mixtral":
        assert why["blk.0.ffn_gate_inp.weight"] == ("F32", "llama.cpp keeps it unquantized (a router, learned positions or a convolution's filter)")
    if dtype == "q4_k_m":  # every row is 256 wide: the head and some attn_v get more bits (layer 1 of 2 here)
        assert why["blk.0.attn_q.weight"] == ("Q4_K", "q4_k_m's type")
        assert why["output.weight" if "output.weight" in why else "token_embd.weight"][1].endswith("more bits")
        assert why["blk.1.attn_v.weight"] == ("Q6_K", "llama.cpp's rule for attn_v in q4_k_m: more bits")
    assert os.listdir(tmp_path / "ours") == ["m.gguf"]  # the f32 intermediate is gone
    report = gptconv.verify(str(summary.out), against="llama.cpp")  # dequantized here, as llama.cpp reads it
    assert report.passed, (report.first_divergent_step, report.notes)


def test_without_llama_cpp_it_fails_at_once_in_one_line(wide_families, tmp_path):
    hide = tmp_path / "hide" / "llama_cpp"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    env = {**os.environ, "PYTHONPATH": str(hide.parent)}
    out = tmp_path / "q.gguf"
    r = run_cli("export", wide_families["qwen3"], "--format", "gguf", "--dtype", "q4_k_m", "-o", out, env=env)
    assert r.returncode == 2 and "gptconv[llama-cpp]" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == ["hide"]  # nothing written
    r = run_cli("export", wide_families["qwen3"], "--format", "gguf", "--dtype", "q8_0", "-o", out, env=env)
    assert r.returncode == 0, r.stderr  # q8_0 is ours (gguf.quants), as llama.cpp's converter writes it


def test_quantized_types_exist_only_in_gguf(wide_families, tmp_path):
    r = run_cli("export", wide_families["qwen3"], "--format", "safetensors", "--dtype", "q4_k_m", "-o", tmp_path / "x")
    assert r.returncode == 2 and "--dtype q4_k_m exists only in GGUF" in r.stderr


def test_the_quality_table_runs(wide_families):
    """The README's table comes from this tool; here on a random model, two types."""
    import subprocess
    import sys
    from pathlib import Path
    text = Path(__file__).parent / "data" / "alice-chapter-1.txt"
    r = subprocess.run([sys.executable, "-m", "gptconv.bench.quality", str(wide_families["qwen3"]), str(text), "--ctx", "32",
                        "--types", "q8_0,q4_k_m"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| q")]
    assert [row.split("|")[1].strip() for row in rows] == ["q8_0", "q4_k_m"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


@pytest.mark.parametrize("sig,code,said", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_while_llama_cpps_quantizer_runs_stops_it_and_cleans_up(wide_families, tmp_path, sig, code, said):
    """The quantizer runs in a child; caught there (and stopped, so that it cannot finish first), the
    export ends at once: exit 128 + signal, one line, the child gone, the f32 intermediate and the
    partial output removed, the old output kept."""
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    # SIGINT as a terminal's Ctrl-C delivers it: a runner (pytest-xdist's workers) may start us with it ignored,
    # which a child inherits and Python then leaves ignored
    p = subprocess.Popen([sys.executable, "-m", "gptconv", "export", str(wide_families["mixtral"]), "--format", "gguf",
                          "--dtype", "q4_k_m", "-o", str(out), "--force"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    child = None
    try:
        children = Path(f"/proc/{p.pid}/task/{p.pid}/children")
        deadline = time.monotonic() + 120
        # the quantizer once it runs: a child caught between fork and exec still has the export's own
        # command line (on a loaded machine it was caught there), so wait for its exec
        while time.monotonic() < deadline and p.poll() is None and child is None:
            kids = children.read_text().split() if children.exists() else []
            child = next((int(k) for k in kids if "quantizer_child.py" in _cmdline(int(k))), None)
            time.sleep(0.001)
        assert child is not None, "the export ended before its quantizer could be caught"
        os.kill(child, signal.SIGSTOP)
        assert "quantizer_child.py" in _cmdline(child)
        assert any(name.endswith(".f32") for name in os.listdir(tmp_path))  # the intermediate, under the temporary name
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:  # whatever failed, nothing is left stopped or running
        if p.poll() is None:
            p.kill()
        p.wait()
        if child is not None and "quantizer_child.py" in _cmdline(child):
            os.kill(child, signal.SIGKILL)
    assert p.returncode == code, (p.returncode, err)
    assert err.strip().splitlines() == [f"gptconv: error: {said}"], err
    assert not Path(f"/proc/{child}").exists()  # killed and reaped
    assert os.listdir(tmp_path) == ["m.gguf"] and out.read_bytes() == b"old"
