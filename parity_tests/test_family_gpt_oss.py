"""gpt-oss (gpt_oss): biases on q, k, v and the output, a sink logit per head in every attention softmax,
windows (8 here; 128 in the releases) on the even layers, YaRN (not rounded out), and on every layer a router
with a bias choosing 2 of 4 experts (4 of 32 or 128) by logit, weighed by the softmax of the chosen, each a
clamped SwiGLU with biases whose gate and up columns HF interleaves. ``family_battery.py`` runs the checks
every family passes, past the window."""

from __future__ import annotations

import pytest
import torch

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from fixtures import mxfp4_folder
from gptconv.writers import export
from helpers import assert_planted_fault_fails, assert_verifies_at_fp32_and_bf16, recorded_reference, run_cli

ARCH = "gpt_oss"
VOCAB = "gpt-2"
SHAPE = dict(vocab_size=50257, max_position_embeddings=128, hidden_size=128, intermediate_size=64,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
             num_experts_per_tok=2, sliding_window=8, bos_token_id=50256, eos_token_id=50256,
             pad_token_id=50256)
STEPS = ["block.0.router", "2 of 4 experts per token", "each position sees the last 8 only"]
# the cards: 21B with 3.6B active, 117B with 5.1B active
PRESETS = {"gpt-oss-20b": 20_914_757_184, "gpt-oss-120b": 116_829_156_672}


@pytest.fixture(scope="module")
def recorded(ckpt, tmp_path_factory):
    return recorded_reference(ckpt, tmp_path_factory.mktemp("ref"))


@pytest.mark.parametrize("fault", ["sinks left out", "no gate clamp", "no up clamp", "gate and up swapped",
                                   "softmax over all experts"])
def test_planted_faults_fail_verify(ckpt, recorded, monkeypatch, fault):
    """Each of gpt-oss's own steps, done another way, is caught by verify against transformers."""
    from gptconv.layers import attention, mlp
    if fault == "sinks left out":
        real = attention.causal_attention
        monkeypatch.setattr(attention, "causal_attention", lambda *a, **k: real(*a[:9]))
    elif fault == "no gate clamp":
        monkeypatch.setattr(mlp.ClampedSwiGLU, "forward", lambda self, x, tap=None: self.down(
            (self.up(x).clamp(-self.limit, self.limit) + 1) * (self.gate(x) * torch.sigmoid(self.gate(x) * self.alpha))))
    elif fault == "no up clamp":
        monkeypatch.setattr(mlp.ClampedSwiGLU, "forward", lambda self, x, tap=None: self.down(
            (self.up(x) + 1) * (self.gate(x).clamp(max=self.limit)
                                * torch.sigmoid(self.gate(x).clamp(max=self.limit) * self.alpha))))
    elif fault == "gate and up swapped":
        monkeypatch.setattr(mlp.ClampedSwiGLU, "forward", lambda self, x, tap=None: self.down(
            (self.gate(x).clamp(-self.limit, self.limit) + 1)
            * (self.up(x).clamp(max=self.limit) * torch.sigmoid(self.up(x).clamp(max=self.limit) * self.alpha))))
    else:  # the k chosen weighed by their share of the softmax over every expert, not renormalised
        monkeypatch.setattr(mlp.MoE, "normalize", False, raising=False)
        real_init = mlp.MoE.__init__

        def init(self, *a, **k):
            real_init(self, *a, **k)
            self.normalize = False
        monkeypatch.setattr(mlp.MoE, "__init__", init)
    assert_planted_fault_fails(ckpt, recorded, fault)


def test_the_experts_clamp_here(ckpt):
    """The fixture reaches both clamps: some expert's gate exceeds 7 on random ids, and some up ±7."""
    model = gptconv.load(ckpt)
    seen, ups = [], []
    hooks = [e.gate.register_forward_hook(lambda m, i, o: seen.append(float(o.max())))
             for b in model.blocks for e in b.mlp.experts]
    hooks += [e.up.register_forward_hook(lambda m, i, o: ups.append(float(o.abs().max())))
              for b in model.blocks for e in b.mlp.experts]
    with torch.no_grad():
        model(torch.randint(0, 50257, (1, 64), generator=torch.Generator().manual_seed(0)))
    for h in hooks:
        h.remove()
    assert max(seen) > 7.0 and max(ups) > 7.0


# --- MXFP4: the experts as the released checkpoints store them ---------------------------------------------

@pytest.fixture(scope="module")
def mxfp4_ckpt(ckpt, tmp_path_factory):
    return mxfp4_folder(ckpt, tmp_path_factory.mktemp("gpt_oss-mxfp4") / "hf")


def test_mxfp4_experts_read_as_transformers_dequantizes_them(mxfp4_ckpt):
    """Bit for bit what transformers' own dequantization gives (``convert_moe_packed_tensors``), in bfloat16
    and float32 alike (every MXFP4 value is a bfloat16); the pair is one tensor to the ledger."""
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    src = gptconv.open_source(str(mxfp4_ckpt))
    raw = load_file(mxfp4_ckpt / "model.safetensors")
    names = [k.removesuffix("_blocks") for k in raw if k.endswith("_blocks")]
    assert len(names) == 2 * 4 and not any(k.endswith(("_blocks", "_scales")) for k in src.tensors)
    for name in names:
        ours = src.tensors[name].load()
        for dtype in (torch.bfloat16, torch.float32):
            theirs = convert_moe_packed_tensors(raw[name + "_blocks"], raw[name + "_scales"], dtype=dtype)
            assert torch.equal(ours.to(dtype), theirs), name
        assert src.stored_types[name] == "MXFP4"


def test_mxfp4_checkpoint_verifies_against_transformers(mxfp4_ckpt):
    """transformers reads the MXFP4 folder itself (on CPU it dequantizes): verify passes at fp32 and bf16."""
    assert_verifies_at_fp32_and_bf16(mxfp4_ckpt, "MXFP4")


def test_mxfp4_experts_stay_mxfp4_in_gguf_as_the_converter_keeps_them(mxfp4_ckpt, tmp_path):
    """Our GGUF of the MXFP4 folder equals llama.cpp's converter's, tensor for tensor (the experts MXFP4,
    the same bytes), reads back to the same weights, and verifies against llama.cpp."""
    import llama_cpp_tools
    from gguf import GGUFReader
    ours = export(str(mxfp4_ckpt), tmp_path / "ours.gguf", "gguf", "f32").out
    theirs = llama_cpp_tools.convert(mxfp4_ckpt, tmp_path / "theirs.gguf", "f32")
    types = {t.name: t.tensor_type.name for t in GGUFReader(ours).tensors}
    assert {n for n, t in types.items() if t == "MXFP4"} == {f"blk.{i}.ffn_{m}_exps.weight" for i in range(4)
                                                             for m in ("gate", "up", "down")}
    keys, tensors = llama_cpp_tools.differences(ours, theirs)
    assert tensors == [], tensors
    folder, back = gptconv.load(str(mxfp4_ckpt)), gptconv.load(str(ours))
    for (a, x), (b, y) in zip(folder.state_dict().items(), back.state_dict().items()):
        assert a == b and torch.equal(x, y), a
    report = gptconv.verify(str(ours), against="llama.cpp")
    print(f"\nMXFP4 GGUF vs llama.cpp: max|Δ| = {report.max_abs_diff:.3e}")
    assert report.passed, (report.first_divergent_step, report.notes)


def test_a_gguf_runs_llama_cpps_yarn_whose_ramp_is_rounded(ckpt, ours_gguf):
    """gpt-oss's YaRN leaves its ramp's edges where they fall (truncate: false); llama.cpp rounds them out to
    whole dimensions for every model, and the converter writes the file all the same. Our GGUF reads back as
    llama.cpp runs it. At the releases' sizes (head 64, base 150,000, ×32 over 4,096) 9 of the 32 frequencies
    differ, by up to 76%: 0.03 rad at position 128, 0.9 rad at 4,096."""
    from gptconv.layers.rope import rope_frequencies
    folder, gguf = gptconv.open_source(str(ckpt)).config, gptconv.open_source(str(ours_gguf)).config
    assert not folder.rope.scaling.truncate and gguf.rope.scaling.truncate
    assert folder.rope.scaling.factor == gguf.rope.scaling.factor == 32.0
    release = gptconv.models.PRESETS["gpt-oss-20b"]
    ours = rope_frequencies(release.head_dim, release.rope.theta, release.rope.scaling)
    rounded = rope_frequencies(release.head_dim, release.rope.theta, gguf.rope.scaling)
    assert int((ours != rounded).sum()) == 9 and 0.76 < ((ours - rounded).abs() / ours).max() < 0.77


@pytest.mark.parametrize("case", ["no scales", "no blocks", "shapes differ", "not uint8", "both", "method"])
def test_a_bad_mxfp4_pair_is_one_line_naming_it(case, tmp_path):
    """Refused before anything is read, naming the config file and the tensor."""
    from gptconv.convert.keymap import TensorInfo
    from gptconv.errors import GptconvError
    from gptconv.sources.quantized import dequantized
    info = lambda shape, dtype=torch.uint8: TensorInfo(shape, dtype, lambda: None)  # noqa: E731
    tensors = {"w_blocks": info((2, 64, 2, 16)), "w_scales": info((2, 64, 2)), "b": info((4,), torch.float32)}
    config = {"quantization_config": {"quant_method": "mxfp4"}}
    if case == "no scales":
        del tensors["w_scales"]
    elif case == "no blocks":
        del tensors["w_blocks"]
    elif case == "shapes differ":
        tensors["w_scales"] = info((2, 64, 3))
    elif case == "not uint8":
        tensors["w_scales"] = info((2, 64, 2), torch.float32)
    elif case == "both":
        tensors["w"] = info((2, 64, 64), torch.float32)
    else:
        config["quantization_config"]["quant_method"] = "awq"
    with pytest.raises(GptconvError) as e:
        dequantized(tensors, config, tmp_path / "config.json")
    message = str(e.value)
    assert "\n" not in message and "config.json" in message and ("w_" in message or "'w'" in message or "awq" in message)
    assert dequantized(tensors, {}, tmp_path / "config.json") is tensors  # unquantized: as they are


def test_pull_names_the_family_and_the_mxfp4_tensors(mxfp4_ckpt):
    r = run_cli("pull", mxfp4_ckpt)
    assert r.returncode == 0, r.stderr
    assert "architecture  llama (the gpt_oss family)" in r.stdout and "MXFP4 (8 tensors)" in r.stdout
