"""The checks every family passes, run by each family's own test file (``test_family_<name>.py``).

A family test file sets, at module level, what its checkpoint is and what its family adds:

    ARCH = "olmo2"                  # transformers' model_type of the random-init checkpoint
    VOCAB = "gpt-2"                 # llama.cpp's test vocabulary it carries (what both converters read)
    SHAPE = dict(...)               # the config: tiny, every feature of the family on
    STEPS = [...]                   # steps ``trace`` must name (the family's new ones)
    PRESETS = {name: count}         # presets and their published parameter counts
    KNOWN = {key: reason}           # GGUF metadata keys allowed to differ from llama.cpp's converter
    LLAMA_CPP_LENGTH = None         # positions llama.cpp is compared on (None: verify's default)
    LLAMA_CPP_CHANGES = {}          # config changes for the checkpoint llama.cpp runs, where llama.cpp runs
                                    # this one differently by design (a test in the file shows how)
    GENERATION_LENGTH = 120         # positions generated through (prompt included), at most the context
    FLOAT64_BOUND = False           # fp32 parity judged against transformers' own float32 error (recurrent layers)
    GGUF_CHANGES = {}               # config changes for the checkpoint every GGUF test converts, where llama.cpp's
                                    # format has no place for a feature (a test in the file shows the refusal)
    CONVERTER_OPTIONS = ()          # flags for llama.cpp's converter (``--no-mtp``: the file has no MTP layers)
    GGUF = True                     # False: the family has no GGUF yet (its file tests the one-line refusal)
    CONFIG_JSON = {}                # keys added to the saved config.json (legacy names released files carry)
    ROUNDED_IN_GGUF = {}            # our parameters a GGUF holds through a transform that float32 cannot invert
                                    # exactly (name suffix → f: f of both within 2 float32 ulps)

and then ``from family_battery import *``: the tests below are collected in that file, against its
checkpoint (made once per file). Every test runs past every window the checkpoint has.
"""

from __future__ import annotations

import pytest
import torch

import gptconv
import llama_cpp_tools
from fixtures import make_checkpoint
from gptconv.layers.kv_cache import sliding_window
from gptconv.llamacpp import LlamaCpp
from gptconv.models import PRESETS as ALL_PRESETS, build
from gptconv.parity.compare import CALIBRATION_FACTOR, FP32
from gptconv.writers import export
from helpers import (TORTURE, assert_fp32_parity, assert_generation_matches, assert_verifies_at_fp32_and_bf16, hf_model,
                     hf_round_trip, random_ids, run_cli)

PROVENANCE = {"general.name": "the model's name: ours is the output file's stem, the converter's the folder name"}


@pytest.fixture(scope="module")
def ckpt(request, tmp_path_factory):
    m = request.module
    return make_checkpoint(tmp_path_factory.mktemp(m.ARCH) / "hf", m.ARCH, m.VOCAB, m.SHAPE,
                           config_json=getattr(m, "CONFIG_JSON", None))


@pytest.fixture(scope="module")
def gguf_ckpt(request, ckpt, tmp_path_factory):
    """The checkpoint the GGUF tests convert: ``ckpt``, or with GGUF_CHANGES where llama.cpp cannot hold it."""
    m = request.module
    changes = getattr(m, "GGUF_CHANGES", {})
    if not changes:
        return ckpt
    return make_checkpoint(tmp_path_factory.mktemp(m.ARCH + "-gguf") / "hf", m.ARCH, m.VOCAB, {**m.SHAPE, **changes},
                           config_json=getattr(m, "CONFIG_JSON", None))


@pytest.fixture(scope="module")
def theirs_each(request, gguf_ckpt):
    """llama.cpp's converter's GGUFs of the checkpoint, f32 and q8_0, made in one converter process."""
    return llama_cpp_tools.convert_each(gguf_ckpt, {t: gguf_ckpt.parent / f"theirs-{t}.gguf" for t in ("f32", "q8_0")},
                                        _options(request.module))


@pytest.fixture(scope="module")
def theirs(theirs_each):
    """llama.cpp's converter's GGUF of the checkpoint (f32)."""
    return theirs_each["f32"]


def _options(module) -> tuple[str, ...]:
    return tuple(getattr(module, "CONVERTER_OPTIONS", ()))


@pytest.fixture(scope="module")
def ours_gguf(gguf_ckpt):
    return export(str(gguf_ckpt), gguf_ckpt.parent / "ours.gguf", "gguf", "f32").out


def plant(monkeypatch, **fields) -> None:
    """A planted fault: every DecoderConfig made from now on (in this test) has ``fields`` set as given,
    whatever its source says."""
    from gptconv.layers.decoder import DecoderConfig
    plant_part(monkeypatch, DecoderConfig, **fields)


def plant_part(monkeypatch, part: type, **fields) -> None:
    """A planted fault in one part of a block: every ``part`` config (``mlp.Experts``, ``Multipliers``, …)
    made from now on (in this test) has ``fields`` set as given, whatever its source says."""
    real = part.__post_init__

    def planted(self):
        real(self)
        for name, value in fields.items():
            object.__setattr__(self, name, value)
    monkeypatch.setattr(part, "__post_init__", planted)


def plant_experts(monkeypatch, **fields) -> None:
    """``plant_part`` of the routed experts (``mlp.Experts``)."""
    from gptconv.layers.mlp import Experts
    plant_part(monkeypatch, Experts, **fields)


def test_logits_match_transformers_past_every_window(request, ckpt):
    """Within FP32's bound; for a family with ``FLOAT64_BOUND`` (a recurrent state carries rounding along the
    sequence, so transformers' own float32 logits stray past FP32's fixed bound) within twice transformers'
    own max|float32 − float64|, and as close to float64 in RMS as transformers' float32 is (× 2)."""
    ours = gptconv.load(ckpt)
    c = ours.config
    window = sliding_window(c) or 0
    assert c.context_length >= 3 * window
    ids = random_ids(c.vocab_size, c.context_length)
    with torch.no_grad():
        mine, ref = ours(ids), hf_model(ckpt)(ids).logits
        if not getattr(request.module, "FLOAT64_BOUND", False):
            return assert_fp32_parity(mine, ref, ckpt.parent.name)
        truth = hf_model(ckpt, torch.float64)(ids).logits
    own, rms = (ref - truth).abs().max().item(), lambda x: x.double().pow(2).mean().sqrt().item()  # noqa: E731
    print(f"\n{ckpt.parent.name}: max|Δ| vs transformers {(mine - ref).abs().max():.3e}; vs float64 ours "
          f"{(mine - truth).abs().max():.3e}, transformers' {own:.3e}; RMS {rms(mine - truth):.2e} / {rms(ref - truth):.2e}")
    assert (mine - ref).abs().max().item() <= max(FP32.atol, CALIBRATION_FACTOR * own)
    assert rms(mine - truth) <= CALIBRATION_FACTOR * rms(ref - truth)
    assert torch.equal(mine.argmax(-1), ref.argmax(-1))


def test_kv_cache_generation_equals_recompute_and_transformers(request, ckpt):
    assert_generation_matches(ckpt, getattr(request.module, "GENERATION_LENGTH", 120))


def test_hf_export_round_trip_is_bit_exact(ckpt, tmp_path):
    hf_round_trip(ckpt, tmp_path / "out")


def test_verify_against_transformers_float64_calibrated(ckpt):
    assert_verifies_at_fp32_and_bf16(ckpt, ckpt.parent.name)


def test_our_gguf_equals_llama_cpps_converter(request, ours_gguf, theirs):
    keys, tensors = llama_cpp_tools.differences(ours_gguf, theirs)
    assert tensors == [], tensors
    known = getattr(request.module, "KNOWN", {})
    unexplained = {k: v for k, v in keys.items() if k not in PROVENANCE and k not in known}
    assert not unexplained, unexplained


def test_our_q8_0_gguf_equals_llama_cpps_converter(request, gguf_ckpt, theirs_each, tmp_path):
    """At q8_0: the same choice of tensors kept in F32 (norms, routers, …) and the same quantized bytes;
    the file loads (dequantized) and runs."""
    ours = export(str(gguf_ckpt), tmp_path / "ours.gguf", "gguf", "q8_0").out
    keys, tensors = llama_cpp_tools.differences(ours, theirs_each["q8_0"])
    assert tensors == [], tensors
    known = getattr(request.module, "KNOWN", {})
    assert not {k: v for k, v in keys.items() if k not in PROVENANCE and k not in known}
    model = gptconv.load(ours)
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]]))).all()


def test_llama_cpps_gguf_loads_tokenizes_and_equals_ours(request, gguf_ckpt, theirs):
    """The converter's file: the same weights as our model of the HF folder, bit for bit; the same
    token ids as llama.cpp's; and it verifies against transformers (read by transformers' GGUF loader,
    where it reads the architecture)."""
    model, folder = gptconv.load(theirs), gptconv.load(gguf_ckpt)
    rounded = getattr(request.module, "ROUNDED_IN_GGUF", {})
    for (a, x), (b, y) in zip(model.state_dict().items(), folder.state_dict().items()):
        f = next((f for suffix, f in rounded.items() if a.endswith(suffix)), None)
        assert a == b and (x.equal(y) if f is None else torch.allclose(f(x), f(y), rtol=2**-22, atol=0)), a
    tok = gptconv.load_tokenizer(str(theirs))
    with LlamaCpp(theirs, vocab_only=True) as llm:
        for text in TORTURE:
            assert tok.encode(text) == llm.tokenize(text), text


def test_our_gguf_verifies_against_llama_cpp(request, ours_gguf, tmp_path):
    m = request.module
    changes = getattr(m, "LLAMA_CPP_CHANGES", {})
    if changes:
        folder = make_checkpoint(tmp_path / "hf", m.ARCH, m.VOCAB, {**m.SHAPE, **getattr(m, "GGUF_CHANGES", {}),
                                                                   **changes}, config_json=getattr(m, "CONFIG_JSON", None))
        ours_gguf = export(str(folder), tmp_path / "ours.gguf", "gguf", "f32").out
    report = gptconv.verify(str(ours_gguf), against="llama.cpp", length=getattr(m, "LLAMA_CPP_LENGTH", None))
    print(f"\n{ours_gguf.parent.name}: our GGUF vs llama.cpp: max|Δ| = {report.max_abs_diff:.3e} "
          f"at {report.inputs['random']} positions")
    assert report.passed, (report.first_divergent_step, report.notes)


def test_trace_names_the_new_steps(request, ckpt):
    r = run_cli("trace", ckpt, "The capital of France is")
    assert r.returncode == 0, r.stderr
    for step in request.module.STEPS:
        assert step in r.stdout, step


def test_presets_have_the_published_parameter_counts(request):
    for name, count in request.module.PRESETS.items():
        with torch.device("meta"):
            model = build(ALL_PRESETS[name])
        assert sum(p.numel() for p in model.parameters()) == count, name


__all__ = [name for name in dir() if name.startswith("test_")] + ["ckpt", "gguf_ckpt", "theirs", "theirs_each",
                                                                    "ours_gguf", "FP32",
                                                                    "plant", "plant_experts",
                                                                    "plant_part"]
