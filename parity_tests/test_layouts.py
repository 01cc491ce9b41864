"""gptconv.state_dict: any checkpoint as the state dict of transformers' model, of ours, or of a user's
own module through a key table the user writes (examples/nanogpt.py, examples/meta_llama.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import gptconv
from gptconv.convert.keymap import KeyMap, Map, Rule, Stacked, Tied
from gptconv.models import build
from gptconv.parity.compare import FP32
from gptconv.writers import export
from helpers import hf_model, random_ids

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
import meta_llama  # noqa: E402
import nanogpt  # noqa: E402

FAMILIES = [("ckpts", "tiny"), ("llamas", "llama3-gqa"), ("llamas", "tied"), ("families", "qwen3"),
            ("families", "phi3"), ("families", "mixtral"), ("gemma3", None)]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from fixtures import make_gemma3
    return make_gemma3(tmp_path_factory.mktemp("gemma3") / "gemma3")


def folder_of(request, fixture: str, name: str | None) -> Path:
    value = request.getfixturevalue(fixture)
    return value if name is None else value[name]


def hf_logits(folder: Path, state: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """transformers' model of ``folder``'s config with ``state`` loaded by load_state_dict: every key,
    nothing left over."""
    import transformers
    config = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        return model.eval()(ids).logits


@pytest.mark.parametrize("fixture,name", FAMILIES)
def test_hf_layout_loads_into_transformers_from_a_folder_and_from_gguf(request, tmp_path, fixture, name):
    folder = folder_of(request, fixture, name)
    ids = random_ids(gptconv.open_source(folder).config.vocab_size, 24, batch=1)
    with torch.no_grad():
        reference = hf_model(folder)(ids).logits
    from_folder = hf_logits(folder, gptconv.state_dict(folder, "hf"), ids)
    assert torch.equal(from_folder, reference)  # the same tensors, in the same places
    gguf = export(str(folder), tmp_path / "m.gguf", "gguf", "f32").out  # Q/K permuted, Conv1D transposed there
    from_gguf = hf_logits(folder, gptconv.state_dict(gguf, "hf"), ids)
    assert (from_gguf - reference).abs().max() <= 1e-5


@pytest.mark.parametrize("fixture,name", FAMILIES)
def test_gptconv_layout_loads_into_ours(request, fixture, name):
    folder = folder_of(request, fixture, name)
    src = gptconv.open_source(folder)
    model = build(src.config)
    model.load_state_dict(gptconv.state_dict(folder), strict=True)
    ids = random_ids(src.config.vocab_size, 24, batch=1)
    with torch.no_grad():
        assert torch.equal(model.eval()(ids), gptconv.load(folder)(ids))


def test_a_quantized_gguf_comes_out_dequantized(llamas, tmp_path):
    folder = llamas["llama3-gqa"]
    q8 = export(str(folder), tmp_path / "q8.gguf", "gguf", "q8_0").out
    ids = random_ids(gptconv.open_source(folder).config.vocab_size, 24, batch=1)
    state = gptconv.state_dict(q8, "hf", dtype="bfloat16")
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    ours = gptconv.load(q8)
    with torch.no_grad():
        theirs = hf_logits(folder, {k: v.float() for k, v in gptconv.state_dict(q8, "hf").items()}, ids)
        assert (theirs - ours(ids)).abs().max() <= FP32.atol


def test_a_nanogpt_module_with_a_users_table(ckpts, tmp_path):
    folder = ckpts["tiny"]
    ids = random_ids(gptconv.open_source(folder).config.vocab_size, 24, batch=1)
    gguf = export(str(folder), tmp_path / "m.gguf", "gguf", "f32").out
    with torch.no_grad():
        ours = gptconv.load(folder)(ids)
        for source in (folder, gguf):
            assert (nanogpt.load(str(source))(ids) - ours).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["llama3-gqa", "tied"])
def test_a_meta_style_llama_module_with_a_users_table(llamas, tmp_path, name):
    folder = llamas[name]
    ids = random_ids(gptconv.open_source(folder).config.vocab_size, 24, batch=1)
    gguf = export(str(folder), tmp_path / "m.gguf", "gguf", "f32").out
    with torch.no_grad():
        ours = gptconv.load(folder)(ids)
        for source in (folder, gguf):
            # Meta's RoPE multiplies complex pairs where ours rotates halves: FP32 rounding apart
            assert (meta_llama.load(str(source))(ids) - ours).abs().max() <= FP32.atol


def test_an_incomplete_table_names_the_tensors_it_leaves_out(ckpts):
    from gptconv.convert.keymap import KeyMap
    table = KeyMap("mine", [r for r in nanogpt.NANOGPT.rules if "mlp.c_fc" not in r.source and "ln_f" not in r.source])
    with pytest.raises(gptconv.GptconvError) as e:
        gptconv.state_dict(ckpts["tiny"], layout=table)
    message = str(e.value)
    assert "key map mine: no row takes 6 of" in message and "\n" not in message  # 2 layers × 2 + ln_f's 2
    for theirs, ours in [("transformer.h.{i}.mlp.c_fc.weight", "blocks.{i}.mlp.fc.weight"),
                         ("transformer.ln_f.bias", "norm_f.bias")]:
        assert f"'{theirs}' (ours '{ours}')" in message


def test_an_unknown_layout_is_one_line(ckpts):
    with pytest.raises(gptconv.GptconvError, match="layout 'meta': choose gptconv or hf, or give a KeyMap"):
        gptconv.state_dict(ckpts["tiny"], layout="meta")


def test_mixtral_in_transformers_fused_layout_imports_too(families, tmp_path):
    """transformers 5 fuses Mixtral's experts in its module (gate_up_proj, down_proj) and can save them so;
    such a folder maps onto ours as the per-expert files do, and the "hf" state dict is that layout."""
    folder = families["mixtral"]
    hf = hf_model(folder)
    hf.save_pretrained(tmp_path / "fused", save_original_format=False)
    from safetensors import safe_open
    with safe_open(tmp_path / "fused" / "model.safetensors", "pt") as f:
        assert "model.layers.0.mlp.experts.gate_up_proj" in f.keys()
    ids = random_ids(gptconv.open_source(folder).config.vocab_size, 24, batch=1)
    with torch.no_grad():
        assert torch.equal(gptconv.load(tmp_path / "fused")(ids), gptconv.load(folder)(ids))
    assert set(gptconv.state_dict(folder, "hf")) == set(hf.state_dict())


def test_a_tied_row_adds_nothing_to_an_untied_model(llamas):
    from gptconv.convert.keymap import KeyMap
    table = KeyMap("meta", meta_llama.META.rules)  # its Tied("output.weight", …) is for tied checkpoints
    untied = gptconv.state_dict(llamas["llama3-gqa"], layout=table)
    assert torch.equal(untied["output.weight"], gptconv.load(llamas["llama3-gqa"]).lm_head.weight)
    from gptconv.convert.keymap import Tied
    extra = KeyMap("x", [*meta_llama.META.rules, Tied("head_copy.weight", "tok_emb.weight")])
    assert "head_copy.weight" not in gptconv.state_dict(llamas["llama3-gqa"], layout=extra)
    assert "head_copy.weight" in gptconv.state_dict(llamas["tied"], layout=extra)



def nanogpt_with(replace: dict[str, Rule] | None = None, add: list[Rule] | None = None):
    """NANOGPT's rows, with those whose source is a key of ``replace`` put as its value, and ``add`` after."""
    rows = [(replace or {}).get(r.source, r) for r in nanogpt.NANOGPT.rules]
    return KeyMap("mine", [*rows, *(add or [])])


# A user's table that does not fit: one line naming the row (and the name, and its two tensors), where
# state_dict returned a dict that kept the last tensor under a name given two, or left a row unused, or
# failed with a raw AttributeError. Each is built inside the case: KeyMap and the rows check what they can.
UNFIT_TABLES = {
    # one name for two of our tensors: a strict load_state_dict then took wrong weights without a word
    "one template for norm1 and norm2": (
        lambda: nanogpt_with({"transformer.h.{i}.ln_2.weight": Map("transformer.h.{i}.ln_1.weight",
                                                                   "blocks.{i}.norm2.weight")}),
        "key map mine: 'transformer.h.{i}.ln_1.weight' is given two targets, 'blocks.{i}.norm1.weight' and "
        "'blocks.{i}.norm2.weight': one name holds one tensor"),
    "one literal name for two targets": (
        lambda: nanogpt_with({"transformer.ln_f.bias": Map("transformer.ln_f.weight", "norm_f.bias")}),
        "key map mine: 'transformer.ln_f.weight' is given two targets, 'norm_f.weight' and 'norm_f.bias': "
        "one name holds one tensor"),
    "no layer in the name of a layer's tensor": (
        lambda: nanogpt_with({"transformer.h.{i}.ln_1.weight": Map("transformer.ln_1.weight",
                                                                   "blocks.{i}.norm1.weight")}),
        "key map row Map('transformer.ln_1.weight', 'blocks.{i}.norm1.weight'): '{i}' is in the target only: "
        "a field must be in both names, to say which tensor of one is which of the other"),
    "rows that differ but write one name": (  # only the model's layers show it: h.0 is a layer's and ln_f's
        lambda: nanogpt_with({"transformer.ln_f.weight": Map("transformer.h.0.ln_1.weight", "norm_f.weight")}),
        "key map mine: 'transformer.h.0.ln_1.weight' is given two targets, 'blocks.0.norm1.weight' and "
        "'norm_f.weight' (rows Map('transformer.h.{i}.ln_1.weight', 'blocks.{i}.norm1.weight') and "
        "Map('transformer.h.0.ln_1.weight', 'norm_f.weight')): one name holds one tensor"),
    "a tied copy under another tensor's name": (
        lambda: nanogpt_with(add=[Tied("transformer.wpe.weight", "tok_emb.weight")]),
        "key map mine: 'transformer.wpe.weight' is given two targets, 'pos_emb.weight' and 'tok_emb.weight' "
        "(row Tied('transformer.wpe.weight', 'tok_emb.weight')): one name holds one tensor"),
    # rows that do not fit the model
    "a second name for one target": (
        lambda: nanogpt_with(add=[Map("transformer.ln_final.weight", "norm_f.weight")]),
        "key map mine: our 'norm_f.weight' is given two names, 'transformer.ln_f.weight' and "
        "'transformer.ln_final.weight' (rows Map('transformer.ln_f.weight', 'norm_f.weight') and "
        "Map('transformer.ln_final.weight', 'norm_f.weight')): a second name for one tensor is a Tied row"),
    "a target the model does not have": (
        lambda: nanogpt_with(add=[Map("transformer.h.{i}.ln_3.weight", "blocks.{i}.norm3.weight")]),
        "key map mine: row Map('transformer.h.{i}.ln_3.weight', 'blocks.{i}.norm3.weight'): the model has no "
        "parameter 'blocks.{i}.norm3.weight'"),
    "a tied copy of a target the model does not have": (
        lambda: nanogpt_with(add=[Tied("head.weight", "tok_embedding.weight")]),
        "key map mine: row Tied('head.weight', 'tok_embedding.weight'): the model has no parameter "
        "'tok_embedding.weight'"),
    "a part count the config cannot give": (
        lambda: nanogpt_with(add=[Stacked("transformer.h.{i}.experts", "blocks.{i}.mlp.experts.{j}.fc.weight",
                                          lambda c: c.n_experts)]),
        "key map mine: row Stacked('transformer.h.{i}.experts') cannot list its targets for this model: "
        "AttributeError: 'GPT2Config' object has no attribute 'n_experts'"),
    "the rows without their KeyMap": (
        lambda: list(nanogpt.NANOGPT.rules),
        "layout is a list: choose gptconv or hf, or give a KeyMap (KeyMap(name, rows) for a list of rows)"),
}


@pytest.mark.parametrize("case", UNFIT_TABLES)
def test_a_table_that_does_not_fit_is_one_line_naming_its_row(ckpts, case):
    make_table, message = UNFIT_TABLES[case]
    with pytest.raises(gptconv.GptconvError) as e:
        gptconv.state_dict(ckpts["tiny"], layout=make_table())
    assert str(e.value) == message

