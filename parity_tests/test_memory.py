"""Memory by design (issue 48): streamed verify holds one block of one model at a time and never a whole
table; every command's peak is predicted before anything loads, and a plan that does not fit is refused
in one line. Measured in subprocesses (``VmHWM``) on models with Llama 3's 128,256-token vocabulary and
untied head at a small width, where the tables are most of the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gptconv
from gptconv import memory
from fixtures import write_bpe_tokenizer
from helpers import run_cli

VOCAB = 128256  # Llama 3's


def _make(folder: Path, model_type: str, **kw) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, max_position_embeddings=512, tie_word_embeddings=False,
                                  bos_token_id=0, eos_token_id=0, **kw)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.normal_(1, 0.1)
    model.save_pretrained(folder)
    write_bpe_tokenizer(folder, VOCAB)  # 400 tokens of the 128,256: the prompts run too
    return folder


@pytest.fixture(scope="module")
def wide_vocab(tmp_path_factory) -> dict[str, Path]:
    """Llama 3's vocabulary and untied head at width 256 (the tables 97 % of the weights), the same with
    six times the layers, a Qwen3-MoE of that vocabulary, and the first's q8_0 GGUF."""
    root = tmp_path_factory.mktemp("wide-vocab")
    llama = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    out = {"llama": _make(root / "llama", "llama", num_hidden_layers=2, **llama),
           "deep": _make(root / "deep", "llama", num_hidden_layers=12, **llama),
           "moe": _make(root / "moe", "qwen3_moe", hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                        num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64)}
    out["gguf"] = gptconv.export(str(out["llama"]), root / "llama-q8_0.gguf", "gguf", "q8_0").out
    return out


MEASURE = """
import json, sys, torch
from gptconv import memory
from gptconv.loader import open_source, parse_dtype
from gptconv.parity.run import verify_inputs, verify_need
import gptconv
path, stream, dtype, length = sys.argv[1], sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])
import transformers.models.llama.modeling_llama  # noqa: F401 - its import is part of the base
src = open_source(path)
inputs = verify_inputs(src, length, 0)
base = memory.resident()
predicted = verify_need(src, parse_dtype(dtype), [i.shape[1] for i in inputs.values()], stream, "transformers").peak
report = gptconv.verify(path, dtype, length, blockwise=stream)
print(json.dumps({"predicted": predicted, "peak": memory.peak(), "passed": report.passed, "base": base,
                  "reference": report.reference, "positions": sum(i.shape[1] for i in inputs.values()),
                  "longest": max(i.shape[1] for i in inputs.values())}))
"""


def measured(path: Path, stream: bool, dtype: str = "float32", length: int = 512) -> dict:
    """verify of ``path`` in a process of its own: its prediction and its peak resident memory."""
    r = subprocess.run([sys.executable, "-c", MEASURE, str(path), "1" if stream else "0", dtype, str(length)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["passed"] and ("blockwise" in out["reference"]) == stream
    return out


@pytest.mark.parametrize("name,stream,dtype", [("llama", True, "float32"), ("llama", False, "float32"),
                                               ("gguf", True, "float32"), ("moe", True, "float32"),
                                               ("llama", True, "bfloat16")])
def test_the_prediction_is_within_a_quarter_of_the_measured_peak(wide_vocab, name, stream, dtype):
    got = measured(wide_vocab[name], stream, dtype)
    ratio = got["predicted"] / got["peak"]
    print(f"\n{name} {'streamed' if stream else 'whole'} {dtype}: predicted {got['predicted'] / 1e9:.2f} GB, "
          f"peak {got['peak'] / 1e9:.2f} GB (×{ratio:.2f})")
    assert 0.75 <= ratio <= 1.25


def test_a_streamed_verify_holds_one_block_whatever_the_depth(wide_vocab):
    """A streamed verify holds what its design says and no more: the logits it compares (the truth's of
    every input in float64, one other run's in float32, a slice of the head being read) and one float64
    block; six times the layers add at most one block, and the tables are never whole."""
    shallow, deep = measured(wide_vocab["llama"], True), measured(wide_vocab["deep"], True)
    shape = memory.Shape.of(gptconv.open_source(wide_vocab["deep"]).config)
    block = shape.block * 8
    logits = deep["positions"] * VOCAB * 8 + deep["longest"] * VOCAB * 4 + 2 * memory.SLICE_BYTES
    print(f"\n2 layers: {shallow['peak'] / 1e9:.3f} GB, 12 layers: {deep['peak'] / 1e9:.3f} GB (a float64 block "
          f"{block / 1e6:.0f} MB); above the imports {(deep['peak'] - deep['base']) / 1e9:.3f} GB, the logits "
          f"{logits / 1e9:.3f} GB")
    assert deep["peak"] - shallow["peak"] <= block + 64e6
    tables = shape.tables * 4  # one float32 copy of the embedding and the head
    assert deep["peak"] - deep["base"] <= logits + 2 * block + 0.5 * tables


def test_a_plan_that_does_not_fit_is_refused_before_anything_loads(wide_vocab):
    env = {**os.environ, memory.ENV: "700MB"}
    r = run_cli("verify", wide_vocab["llama"], "--no-stream", env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    line = r.stderr.strip()
    assert "needs about" in line and "0.7 GB are available" in line and memory.ENV in line, line
    assert "would fit with --stream --length 64" in line, line
    r = run_cli("generate", wide_vocab["gguf"], "Hi", "-n", "2", env={**os.environ, memory.ENV: "620MB"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "generate with" in r.stderr and "--dtype bf16" in r.stderr, r.stderr


def test_an_export_that_does_not_fit_is_refused_before_anything_is_written(wide_vocab, tmp_path):
    """export holds a tensor at a time: refused in one line where even its largest would not fit, and
    its --check (the written model beside the source, whole) before anything is written."""
    out = tmp_path / "out.gguf"
    r = run_cli("export", wide_vocab["llama"], "--format", "gguf", "-o", out,
                env={**os.environ, memory.ENV: "300MB"})  # its imports and a 131 MB table read, converted, written
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "export of" in r.stderr, r.stderr
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    # the export fits (~0.4 GB and the imports), the check does not (two models of 0.27 GB in float32 and
    # a 512-token window's logits in float64 from each, 1 GB)
    r = run_cli("export", wide_vocab["llama"], "--format", "gguf", "-o", out, "--check", text,
                env={**os.environ, memory.ENV: "1.2GB"})
    assert r.returncode == 2 and "perplexity of" in r.stderr, r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [text]


def test_verify_streams_by_itself_where_the_whole_models_would_not_fit(wide_vocab, monkeypatch):
    from gptconv.parity.run import verify_inputs, verify_need
    src = gptconv.open_source(wide_vocab["deep"])
    lengths = [i.shape[1] for i in verify_inputs(src, 512, 0).values()]

    def peaks() -> tuple[int, int]:  # from what this process holds now
        return tuple(verify_need(src, torch.float32, lengths, s, "transformers").peak for s in (False, True))
    whole, streamed = peaks()
    assert streamed < whole
    monkeypatch.setenv(memory.ENV, str((whole + streamed) // 2))
    assert "blockwise" in gptconv.verify(str(wide_vocab["deep"]), length=512).reference
    monkeypatch.setenv(memory.ENV, str(peaks()[0] + 100_000_000))
    assert "blockwise" not in gptconv.verify(str(wide_vocab["deep"]), length=512).reference


def test_trace_streams_by_itself_and_says_the_same(wide_vocab, monkeypatch):
    whole = gptconv.trace(str(wide_vocab["gguf"]), ids="5,6,7,8", stream=False)
    streamed = gptconv.trace(str(wide_vocab["gguf"]), ids="5,6,7,8", stream=True)
    assert streamed.steps == whole.steps and streamed.top == whole.top
    monkeypatch.setenv(memory.ENV, str(memory.resident() + 200_000_000))
    assert gptconv.trace(str(wide_vocab["gguf"]), ids="5,6,7,8").steps == whole.steps  # it chose to stream


def test_the_limit_is_read_as_a_size():
    assert memory.parse_bytes("8GB") == 8_000_000_000 and memory.parse_bytes("512 MiB") == 512 << 20
    assert memory.parse_bytes("3e9") == 3_000_000_000
    with pytest.raises(gptconv.GptconvError, match="GPTCONV_MEMORY_LIMIT='lots'"):
        memory.parse_bytes("lots")


def test_llama_cpp_runs_every_input_in_one_batch_where_its_file_does_not_fit(wide_vocab, monkeypatch):
    """A file larger than memory is read by llama.cpp once for all the inputs (one batch, each input its own
    sequence), not once an input; the logits are each sequence's alone, to float32 rounding."""
    import gptconv.parity.llama_cpp_reference as reference
    alone = gptconv.verify(str(wide_vocab["gguf"]), against="llama.cpp", length=64)
    monkeypatch.setattr(reference, "fits_in_memory", lambda path: False)
    batched = gptconv.verify(str(wide_vocab["gguf"]), against="llama.cpp", length=64)
    assert alone.passed and batched.passed, (alone.notes, batched.notes)
    print(f"\nmax|Δ| alone {alone.max_abs_diff:.3e}, batched {batched.max_abs_diff:.3e}")
    assert abs(batched.max_abs_diff - alone.max_abs_diff) <= 0.1 * alone.max_abs_diff + 1e-6


@pytest.mark.parametrize("against", ["transformers", "llama.cpp", "recorded"])
def test_every_streamed_run_holds_one_block_at_a_time(wide_vocab, tmp_path, monkeypatch, against):
    """Whatever the reference, a streamed run of ours gives each block back before the next is read: a
    run compared at the logits alone (llama.cpp's, a file recording only some steps) still stops at each
    block, or its lanes would run to the logits holding every block they read (an 8B verify against
    llama.cpp reached 22 GB that way)."""
    from gptconv.streaming import Streamed
    most, ensure = [0], Streamed.ensure

    def counted(self, block):
        ensure(self, block)
        most[0] = max(most[0], len(self.filled))
    monkeypatch.setattr(Streamed, "ensure", counted)
    source = wide_vocab["gguf"] if against == "llama.cpp" else wide_vocab["llama"]
    reference = None
    if against == "recorded":
        reference = tmp_path / "ref.safetensors"
        gptconv.record_reference(str(source), reference, length=32)
    most[0] = 0
    report = gptconv.verify(str(source), length=32, blockwise=True, reference_file=reference,
                            against="llama.cpp" if against == "llama.cpp" else "transformers")
    assert report.passed, report.notes
    assert most[0] == 1, f"{most[0]} blocks of one model in memory at once"
