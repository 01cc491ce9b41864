"""float16 / bfloat16 verify: ours is judged against the reference's own error at that precision.

A correct model passes at every dtype, on random-init fixtures and on real trained weights (SmolLM2,
activations up to ~2e4); a planted fault still fails at bfloat16.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import gptconv.parity.run as verify_run
from gptconv import verify
from gptconv.parity.compare import LOW_PRECISION_FACTOR
from helpers import edited_copy, run_cli, swap


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fixture,name", [("ckpts", "tiny"), ("ckpts", "odd"), ("llamas", "llama3-gqa"),
                                          ("llamas", "tied"), ("llamas", "qwen2"), ("llamas", "llama31-scaled"),
                                          ("families", "mistral-swa"), ("families", "qwen3"), ("families", "phi3"),
                                          ("families", "mixtral")])
def test_correct_random_models_pass(request, fixture, name, dtype):
    report = verify(str(request.getfixturevalue(fixture)[name]), dtype=dtype)
    assert report.passed, (report.first_divergent_step, report.notes)
    assert report.dtype == dtype and report.tolerance["factor"] == LOW_PRECISION_FACTOR
    assert report.reference_own is not None and "fp64 and " + dtype in report.reference


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_smollm2_passes_at_low_precision(smollm2, shared_references, parsed_once, dtype):
    """Real weights: our fp16/bf16 logits are as far from fp32 as transformers' own fp16/bf16 are. (In
    process, so that the float64 truth is run once for both dtypes and the planted fault below; the
    command line's verify --dtype --json on real weights: test_real_weights.py.)"""
    report = verify(str(smollm2), dtype=dtype)
    assert report.passed is True, (report.first_divergent_step, report.notes)
    own = report.reference_own
    print(f"\nSmolLM2 {dtype}: top-1 ours {report.top1_agreement:.4f} / reference's own {own['top1_agreement']:.4f}; "
          f"KL {report.kl_mean:.3e} / {own['kl_mean']:.3e}; RMS ratios " +
          " ".join(f"{s.rms_diff / s.reference_own_rms:.2f}" for s in report.steps if s.reference_own_rms))


@pytest.fixture
def theta_1e4(monkeypatch):
    """Our model (not the reference) with RoPE theta 1e4 instead of the checkpoint's."""
    load = verify_run.load_source

    def wrong(src, dtype=None, *args, **kwargs):
        model = load(src, dtype, *args, **kwargs)
        model.config = dataclasses.replace(model.config, rope=dataclasses.replace(model.config.rope, theta=1e4))
        model._inv_freq.clear()
        return model
    monkeypatch.setattr(verify_run, "load_source", wrong)


def test_smollm2_planted_rope_theta_fails_at_bfloat16(smollm2, shared_references, parsed_once, theta_1e4):
    report = verify(str(smollm2), dtype="bfloat16")
    assert not report.passed
    assert report.first_divergent_step == "block.0"
    own = report.reference_own["top1_agreement"]
    assert 1 - report.top1_agreement > LOW_PRECISION_FACTOR * (1 - own)
    print(f"\nSmolLM2 bf16 with theta 1e4: top-1 {report.top1_agreement:.4f} against the reference's own {own:.4f}")


def test_swapped_norms_fail_against_a_recorded_bfloat16_reference(ckpts, tmp_path):
    ref = tmp_path / "ref.safetensors"
    r = run_cli("reference", ckpts["odd"], "-o", ref, "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    good = run_cli("verify", ckpts["odd"], "--reference", ref, "--dtype", "bfloat16", "--json")
    assert good.returncode == 0, good.stdout
    bad = edited_copy(ckpts["odd"], tmp_path / "bad", swap("transformer.h.1.ln_2.weight", "transformer.h.2.ln_2.weight"))
    r = run_cli("verify", bad, "--reference", ref, "--dtype", "bfloat16", "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["result"]["first_divergent_step"] == "block.1"


def test_a_recorded_reference_without_that_dtype_says_so(ckpts, tmp_path):
    ref = tmp_path / "ref.safetensors"
    assert run_cli("reference", ckpts["tiny"], "-o", ref).returncode == 0
    r = run_cli("verify", ckpts["tiny"], "--reference", ref, "--dtype", "float16")
    assert r.returncode == 2 and "records no float16 run" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_reference_that_overflows_at_the_dtype_cannot_judge(ckpts):
    """No calibration without the reference's own error: said in one line, neither a pass nor a failure."""
    import torch

    import gptconv
    from gptconv.errors import GptconvError
    from gptconv.parity.compare import compare, our_steps
    ours, ref = gptconv.load(ckpts["tiny"], dtype="float16"), gptconv.load(ckpts["tiny"])
    inputs = {"random": torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(0))}
    fp32 = lambda name, ids: our_steps(ref, ids, {"logits"})  # noqa: E731
    overflow = lambda name, ids: {"logits": torch.full_like(fp32(name, ids)["logits"], float("inf"))}  # noqa: E731
    with pytest.raises(GptconvError, match="holds NaN or Inf at 'logits'"):
        compare(ours, inputs, fp32, "tiny", "test", reference_at_dtype=overflow)
    assert compare(ours, inputs, fp32, "tiny", "test", reference_at_dtype=lambda n, ids: our_steps(
        gptconv.load(ckpts["tiny"], dtype="float16"), ids, {"logits"})).passed
