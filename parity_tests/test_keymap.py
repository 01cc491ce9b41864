"""The key-map engine's ledger: every source tensor used once, every target filled once."""

from __future__ import annotations

import pytest
import torch

from gptconv.convert import GPT2_HF, TensorInfo, model_shapes
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
