"""The key-map engine's ledger: every source tensor used once, every target filled once."""

from __future__ import annotations

import pytest
import torch

from gptconv.convert import TensorInfo, model_shapes
from gptconv.families.gpt2 import GPT2_HF
from gptconv.convert.keymap import Fused, KeyMap, Map, Rule, Stacked
from gptconv.families.phi3 import SPLIT_QKV
from gptconv.sources.hf_folder import open_hf_folder
from gptconv.errors import GptconvError
from gptconv.loader import open_source
from gptconv.models import build


def plan_for(tensors: dict[str, TensorInfo], folder):
    src = open_source(folder)
    with torch.device("meta"):
        model = build(src.config)
    return GPT2_HF.plan(tensors, model_shapes(model), src.config, origin="test")


def test_complete_checkpoint_plans(ckpts):
    tensors = open_hf_folder(ckpts["tiny"]).tensors
    plan = plan_for(tensors, ckpts["tiny"])
    assert len(plan.moves) == len(tensors) and plan.layout == "standard"


def test_legacy_layout_drops_buffers_on_purpose(ckpts):
    tensors = open_hf_folder(ckpts["tiny-legacy"]).tensors
    plan = plan_for(tensors, ckpts["tiny"])
    assert plan.layout.startswith("legacy")
    assert sorted(plan.dropped) == sorted(f"transformer.h.{i}.attn.{b}" for i in range(2) for b in ("bias", "masked_bias"))


def test_missing_extra_and_misshapen_tensors_are_named(ckpts):
    tensors = dict(open_hf_folder(ckpts["tiny"]).tensors)
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    good = tensors["transformer.wpe.weight"]
    tensors["transformer.h.0.attn.c_proj.weight"] = TensorInfo((64, 65), torch.float32, good.load)
    tensors["transformer.h.0.attn.rotary.weight"] = good
    tensors["transformer.h.7.ln_1.weight"] = TensorInfo((64,), torch.float32, good.load)
    with pytest.raises(GptconvError) as e:
        plan_for(tensors, ckpts["tiny"])
    msg = str(e.value)
    assert "\n" not in msg
    assert "missing tensor: 'transformer.h.1.mlp.c_fc.bias'" in msg
    assert "unexpected tensor: 'transformer.h.0.attn.rotary.weight'" in msg
    assert "'transformer.h.0.attn.c_proj.weight' is [64, 65]" in msg
    assert "'transformer.h.7.ln_1.weight' → 'blocks.7.norm1.weight'" in msg


def test_integer_tensors_are_refused(ckpts):
    tensors = dict(open_hf_folder(ckpts["tiny"]).tensors)
    tensors["transformer.ln_f.bias"] = TensorInfo((64,), torch.int64, lambda: torch.zeros(64, dtype=torch.int64))
    with pytest.raises(GptconvError, match="non-float tensor: 'transformer.ln_f.bias' is torch.int64"):
        plan_for(tensors, ckpts["tiny"])


def test_tied_copy_must_equal_the_embedding(ckpts):
    tensors = dict(open_hf_folder(ckpts["tiny"]).tensors)
    wte = tensors["transformer.wte.weight"]
    tensors["lm_head.weight"] = wte
    assert len(dict(plan_for(tensors, ckpts["tiny"]).tensors(torch.float32))) == len(tensors) - 1
    tensors["lm_head.weight"] = TensorInfo(wte.shape, wte.dtype, lambda: wte.load() + 1)
    with pytest.raises(GptconvError, match="'lm_head.weight' should be a tied copy"):
        dict(plan_for(tensors, ckpts["tiny"]).tensors(torch.float32))


def test_inverse_map_is_read_off_the_same_table(ckpts):
    import gptconv
    model = gptconv.load(ckpts["tiny"])
    tensors = open_hf_folder(ckpts["tiny"]).tensors
    for name, param in model.named_parameters():
        source, transform = GPT2_HF.source_name(name)
        assert torch.equal(transform.inverse(param.detach(), model.config), tensors[source].load())


# A user's table (gptconv.state_dict(source, KeyMap)) is checked as it is written, row by row and then whole:
# each bad one is one line naming the row, never a KeyError, re.error or AttributeError from the engine.
MALFORMED_TABLES = {
    "field in the source only": (
        lambda: Map("h.{i}.{j}.ln_1.weight", "blocks.{i}.norm1.weight"),
        "key map row Map('h.{i}.{j}.ln_1.weight', 'blocks.{i}.norm1.weight'): '{j}' is in the source only: "
        "a field must be in both names, to say which tensor of one is which of the other"),
    "other field on each side": (
        lambda: Map("h.{j}.ln_1.weight", "blocks.{i}.norm1.weight"),
        "key map row Map('h.{j}.ln_1.weight', 'blocks.{i}.norm1.weight'): '{j}' is in the source only and "
        "'{i}' is in the target only: a field must be in both names, to say which tensor of one is which of the other"),
    "layer in the target only": (
        lambda: Map("ln.weight", "blocks.{i}.norm1.weight"),
        "key map row Map('ln.weight', 'blocks.{i}.norm1.weight'): '{i}' is in the target only: "
        "a field must be in both names, to say which tensor of one is which of the other"),
    "layer in the source only": (
        lambda: Map("h.{i}.ln_f.weight", "norm_f.weight"),
        "key map row Map('h.{i}.ln_f.weight', 'norm_f.weight'): '{i}' is in the source only: "
        "a field must be in both names, to say which tensor of one is which of the other"),
    "a field twice": (
        lambda: Map("h.{i}.{i}.ln_1.weight", "blocks.{i}.norm1.weight"),
        "key map row Map('h.{i}.{i}.ln_1.weight', 'blocks.{i}.norm1.weight'): the source has '{i}' twice"),
    "a number for a field": (
        lambda: Map("h.{0}.ln_1.weight", "blocks.{0}.norm1.weight"),
        "key map row Map('h.{0}.ln_1.weight', 'blocks.{0}.norm1.weight'): the source has '{0}', which is not "
        "a field: a field is a name in braces, {i} for the layer"),
    "an unbalanced brace": (
        lambda: Map("h.{i}.ln_1.weight", "blocks.{i.norm1.weight"),
        "key map row Map('h.{i}.ln_1.weight', 'blocks.{i.norm1.weight'): the target has a '{' that opens or "
        "closes no field"),
    "a closing brace alone": (
        lambda: Map("h.i}.ln_1.weight", "norm_f.weight"),
        "key map row Map('h.i}.ln_1.weight', 'norm_f.weight'): the source has a '}' that opens or closes no field"),
    "no rows": (
        lambda: KeyMap("mine", None),
        "key map mine: its rows must be a list of Map, Tied, Drop, Fused or Stacked rows, not NoneType"),
    "a str as a row": (
        lambda: KeyMap("mine", [Map("wte.weight", "tok_emb.weight"), "wpe.weight"]),
        "key map mine: row 2 is 'wpe.weight', not a row: write Map(source, target), Tied, Drop, Fused or Stacked"),
    "an int as a source": (
        lambda: Map(5, "tok_emb.weight"),
        "key map row Map(5, 'tok_emb.weight'): the source must be a str, not int"),
    "an unknown kind": (
        lambda: Rule("wte.weight", "tok_emb.weight", kind="bogus"),
        "key map row Rule('wte.weight', 'tok_emb.weight', kind='bogus'): kind 'bogus' is none of map, drop, tied, "
        "fused"),
    "no target": (
        lambda: Map("wte.weight", None),
        "key map row Map('wte.weight', None): the target must be a str (one of our parameter names), not NoneType"),
    "a str as the transform": (
        lambda: Map("h.{i}.c_attn.weight", "blocks.{i}.attn.qkv.weight", "transpose"),
        "key map row Map('h.{i}.c_attn.weight', 'blocks.{i}.attn.qkv.weight', 'transpose'): the transform must be "
        "a Transform (such as TRANSPOSE), not str"),
    "a str as a fused row's targets": (
        lambda: Fused("h.{i}.qkv.weight", "blocks.{i}.attn.q.weight", SPLIT_QKV),
        "key map row Fused('h.{i}.qkv.weight', split_qkv): its targets must be a list of our parameter names, "
        "not 'blocks.{i}.attn.q.weight'"),
    "a fused part without the layer": (
        lambda: Fused("h.{i}.qkv.weight", ["blocks.{i}.attn.q.weight", "k.weight"], SPLIT_QKV),
        "key map row Fused('h.{i}.qkv.weight', split_qkv), target 'k.weight': '{i}' is in the source only: "
        "a field must be in both names, to say which tensor of one is which of the other"),
    "stacked parts without {j}": (
        lambda: Stacked("h.{i}.down.weight", "blocks.{i}.mlp.experts.0.down.weight", lambda c: 2),
        "key map row Stacked('h.{i}.down.weight'), target 'blocks.{i}.mlp.experts.0.down.weight': "
        "the target has no '{j}' to number its parts"),
    "one name for two targets": (
        lambda: KeyMap("mine", [Map("h.{i}.ln.weight", "blocks.{i}.norm1.weight"),
                                Map("h.{i}.ln.weight", "blocks.{i}.norm2.weight")]),
        "key map mine: 'h.{i}.ln.weight' is given two targets, 'blocks.{i}.norm1.weight' and "
        "'blocks.{i}.norm2.weight': one name holds one tensor"),
}


@pytest.mark.parametrize("case", MALFORMED_TABLES)
def test_a_malformed_table_is_one_line_naming_its_row(case):
    make, message = MALFORMED_TABLES[case]
    with pytest.raises(GptconvError) as e:
        make()
    assert str(e.value) == message

