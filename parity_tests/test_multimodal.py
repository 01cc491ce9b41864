"""The text model inside multimodal checkpoints: Gemma 3 4B+ (gemma3), Mistral Small 3.x (mistral3), Qwen3-VL
(qwen3_vl), Qwen3.5 (qwen3_5, a hybrid text model) and Gemma 4 (gemma4), random-init wrappers saved by
transformers 5.25.

The text model loads by the wrapper's table row (its prefix, its text_config); the vision tower and the
projector are left out by a listed rule and named in the summary; verify compares ours with transformers'
whole multimodal model, read by its own code and run on text; export writes the text model alone, an HF
folder transformers loads and a GGUF equal, tensor for tensor, to llama.cpp's converter's of the wrapper.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import gptconv
import llama_cpp_tools
from gptconv.families import BY_WRAPPER
from gptconv.families.base import Wrapper
from gptconv.parity.compare import FP32
from gptconv.writers import export
from helpers import random_ids, run_cli

NAMES = ["gemma3", "gemma3-native", "mistral3", "qwen3_vl", "qwen3_5", "gemma4"]
TEXT_TYPES = {"gemma3": "gemma3_text", "mistral3": "mistral", "qwen3_vl": "qwen3", "qwen3_5": "qwen3_5_text",
              "gemma4": "gemma4_text"}


def _kind(name: str) -> str:
    return name.removesuffix("-native")


def _file_keys(folder) -> list[str]:
    with safe_open(folder / "model.safetensors", "pt") as f:
        return list(f.keys())


def _whole(folder, dtype=torch.float32):
    from transformers import AutoModelForImageTextToText
    return AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()


@pytest.mark.parametrize("name", NAMES)
def test_the_text_model_loads_and_what_is_left_out_is_listed(wrappers, name):
    folder = wrappers[name]
    src = gptconv.open_source(folder)
    _, wrapper = BY_WRAPPER[_kind(name)]
    keys = _file_keys(folder)
    vision = [k for k in keys if k.startswith(wrapper.left_out)]
    assert src.wrapper == _kind(name) and sorted(src.left_out) == sorted(vision) and vision
    assert len(src.tensors) == len(keys) - len(vision)  # every other tensor is the text model's
    r = run_cli("pull", folder)
    assert r.returncode == 0, r.stderr
    assert f"left out      {len(vision)} tensors of {wrapper.left_out_what}" in r.stdout


# Gemma 4's near-flat random logits over 32,000 tokens: at 48 random positions (126 in all) our bfloat16 top-1
# differs from the float64 truth at 4, transformers' bfloat16 at 0, while ours is 1.3× its RMS error and 1.6× its
# KL (both within 2×); at 96 the two flip alike (7 and 7 of 174). The top-1 count needs the longer run to mean much.
LENGTH = {"gemma4": 96}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_verify_against_transformers_whole_model_passes(wrappers, name, dtype):
    report = gptconv.verify(str(wrappers[name]), dtype=dtype, length=LENGTH.get(name, 48))
    print(f"\n{name} {dtype}: max|Δ| {report.max_abs_diff:.3e}, largest RMS ratio "
          f"{max(s.ratio or 0 for s in report.steps):.2f}")
    assert report.passed, report.first_divergent_step


def test_a_misread_wrapper_fails_verify(wrappers, monkeypatch):
    """The reference reads the file by transformers' own names, not ours: text layers 0 and 1 read
    the other way round by our table fail at block.0."""
    real = Wrapper.text_name

    def swapped(self, name):
        out = real(self, name)
        if out and out.startswith(("model.layers.0.", "model.layers.1.")):
            a, b = "model.layers.0.", "model.layers.1."
            out = b + out[len(a):] if out.startswith(a) else a + out[len(b):]
        return out
    monkeypatch.setattr(Wrapper, "text_name", swapped)
    report = gptconv.verify(str(wrappers["mistral3"]), length=32)
    assert not report.passed and report.first_divergent_step == "block.0"


def test_qwen3_vl_text_is_qwen3_with_plain_rope(wrappers):
    """Qwen3-VL's interleaved M-RoPE rotates sections of each head by three position streams (time,
    height, width); on text the three are equal and it is plain RoPE: ours (Qwen3's) equals transformers'
    whole Qwen3-VL. With streams that differ (an image's positions) the two part, so the check can fail."""
    ours = gptconv.load(wrappers["qwen3_vl"])
    assert ours.config.family == "qwen3" and ours.config.attention.qk_norm
    whole = _whole(wrappers["qwen3_vl"])
    ids = random_ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        mine, theirs = ours(ids), whole(input_ids=ids).logits
        assert (mine - theirs).abs().max().item() <= FP32.atol
        t = torch.arange(48).expand(2, -1)
        image_like = torch.stack([t, t // 4, t % 4])  # (3, B, T): height and width apart from time
        other = whole(input_ids=ids, position_ids=image_like).logits
    assert (mine - other).abs().max().item() > 0.1


@pytest.mark.parametrize("name", ["gemma3", "mistral3", "qwen3_vl", "qwen3_5", "gemma4"])
def test_hf_export_is_the_text_model(wrappers, tmp_path, name):
    """A text-only HF folder: transformers' text class loads it, its tensors are the wrapper's text
    tensors bit for bit, and it computes what the whole model computes on text."""
    from transformers import AutoModelForCausalLM
    out = tmp_path / "text"
    export(str(wrappers[name]), out, "safetensors", "f32")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == TEXT_TYPES[name]
    text = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    whole = _whole(wrappers[name])
    _, wrapper = BY_WRAPPER[name]
    theirs = {k: v for k, v in whole.state_dict().items() if not k.startswith(wrapper.left_out)}
    prefix = wrapper.module_prefix
    for k, v in text.state_dict().items():
        assert torch.equal(v, theirs[prefix + k.removeprefix("model.") if k.startswith("model.") else k]), k
    ids = random_ids(text.config.vocab_size, 40)
    with torch.no_grad():
        assert (text(ids).logits - whole(input_ids=ids).logits).abs().max().item() <= FP32.atol
    a, b = gptconv.load(wrappers[name]), gptconv.load(out)
    for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), n


# The converter writes Mistral 3's and Qwen3-VL's text models under their multimodal architectures
# (mistral3, qwen3vl: the same hyperparameters, and Qwen3-VL's M-RoPE sections and deepstack count, which
# act with images only); ours writes the text model's own (llama, qwen3), which it computes exactly.
THEIR_ARCH = {"gemma3": "gemma3", "mistral3": "mistral3", "qwen3_vl": "qwen3vl", "qwen3_5": "qwen35", "gemma4": "gemma4"}
CONVERTER_OPTIONS = {"qwen3_5": ("--no-mtp",)}  # transformers saves no MTP layers, which the converter then needs
IMAGE_ONLY = {"qwen3vl.rope.dimension_sections", "qwen3vl.n_deepstack_layers"}


@pytest.mark.parametrize("name", ["gemma3", "mistral3", "qwen3_vl", "qwen3_5", "gemma4"])
def test_gguf_export_equals_llama_cpps_converter(wrappers, tmp_path, name):
    ours = tmp_path / "ours.gguf"
    export(str(wrappers[name]), ours, "gguf", "f32")
    theirs = llama_cpp_tools.convert(wrappers[name], tmp_path / "theirs.gguf", "f32", CONVERTER_OPTIONS.get(name, ()))
    ra, rb = llama_cpp_tools.PlainReader(ours), llama_cpp_tools.PlainReader(theirs)  # each file parsed once
    keys, tensors = llama_cpp_tools.differences(ra, rb)
    assert tensors == []
    a = {k: f.contents() for k, f in ra.fields.items() if not k.startswith("GGUF.")}
    b = {k: f.contents() for k, f in rb.fields.items() if not k.startswith("GGUF.")}
    arch, their_arch = a["general.architecture"], THEIR_ARCH[name]
    assert b["general.architecture"] == their_arch
    for key in keys:
        if key in ("general.name", "general.architecture") or key in IMAGE_ONLY:
            continue
        assert key.startswith(f"{arch}.") or key.startswith(f"{their_arch}."), key  # nothing else differs
        rest = key.split(".", 1)[1]
        assert a.get(f"{arch}.{rest}") == b.get(f"{their_arch}.{rest}"), key  # the same value under the other arch
    report = gptconv.verify(str(ours), against="llama.cpp", length=40)
    assert report.passed, report.notes


def test_refusals_are_one_line(wrappers, tmp_path):
    import shutil
    cases = {}
    for case, edit in {
        "no text_config": lambda c: c.pop("text_config"),
        "unsupported text model": lambda c: c["text_config"].update(model_type="llama"),
    }.items():
        folder = tmp_path / case.replace(" ", "-")
        shutil.copytree(wrappers["gemma3"], folder)
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
        cases[case] = folder
    from safetensors.torch import load_file, save_file
    for case, keep in {"no text weights": lambda k: not k.startswith("language_model."),
                       "a stray tensor": lambda k: True}.items():
        folder = tmp_path / case.replace(" ", "-")
        shutil.copytree(wrappers["gemma3"], folder)
        state = {k: v for k, v in load_file(folder / "model.safetensors").items() if keep(k)}
        if case == "a stray tensor":
            state["audio_tower.proj.weight"] = torch.zeros(2, 2)
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
        cases[case] = folder
    expected = {"no text_config": "without a text_config", "unsupported text model": "text_config's model_type 'llama'",
                "no text weights": "no tensor of the text model", "a stray tensor": "audio_tower.proj.weight"}
    for case, folder in cases.items():
        r = run_cli("trace", folder, "Hello")
        assert r.returncode == 2 and expected[case] in r.stderr, (case, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (case, r.stderr)
