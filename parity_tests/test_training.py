"""What training use needs, tested: gradients through every family equal transformers', dropout acts in
train mode only, torch.compile gives eager's forward and backward, and what gptconv does not implement
for training is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import gptconv
from gptconv.models import build
from helpers import hf_model, random_ids

FAMILIES = [("ckpts", "tiny"), ("llamas", "llama3-gqa"), ("llamas", "tied"), ("families", "mistral-swa"),
            ("families", "qwen3"), ("families", "phi3"), ("families", "mixtral"), ("gemma3", None)]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from fixtures import make_gemma3
    return make_gemma3(tmp_path_factory.mktemp("gemma3") / "gemma3")


def folder_of(request, fixture, name):
    value = request.getfixturevalue(fixture)
    return value if name is None else value[name]


def loss_of(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


@pytest.mark.parametrize("fixture,name", FAMILIES)
def test_gradients_flow_everywhere_and_equal_transformers(request, fixture, name):
    folder = folder_of(request, fixture, name)
    ours = gptconv.load(folder)
    ids = random_ids(ours.config.vocab_size, 40, batch=2)
    loss = loss_of(ours(ids), ids)
    loss.backward()
    missing = [n for n, p in ours.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []
    hf = hf_model(folder)
    hf_loss = loss_of(hf(ids).logits, ids)
    hf_loss.backward()
    assert abs(loss.item() - hf_loss.item()) <= 1e-5 * abs(hf_loss.item())
    ours_grad, theirs = ours.tok_emb.weight.grad, hf.get_input_embeddings().weight.grad
    assert (ours_grad - theirs).abs().max() <= 1e-5 * theirs.abs().max() + 1e-7


def test_dropout_acts_in_train_mode_only(ckpts, llamas):
    for folder, change in ((ckpts["tiny"], dict(embd_dropout=0.2, resid_dropout=0.2, attn_dropout=0.2)),
                           (llamas["llama3-gqa"], dict(dropout=0.3))):
        src = gptconv.open_source(folder)
        c = src.config
        model = build(dataclasses.replace(c, attention=dataclasses.replace(c.attention, **change))
                      if hasattr(c, "attention") else dataclasses.replace(c, **change))
        model.load_state_dict(gptconv.load(folder).state_dict())
        ids = random_ids(src.config.vocab_size, 24, batch=1)
        model.train()
        torch.manual_seed(0)
        a = model(ids)
        torch.manual_seed(1)
        b = model(ids)
        assert (a - b).abs().max() > 1e-3  # dropout drew differently
        model.eval()
        with torch.no_grad():
            assert torch.equal(model(ids), gptconv.load(folder)(ids))  # and is off in eval mode


@pytest.mark.parametrize("fixture,name", [("ckpts", "tiny"), ("llamas", "llama3-gqa")])
def test_torch_compile_gives_eagers_forward_and_backward(request, fixture, name):
    folder = folder_of(request, fixture, name)
    eager, compiled_model = gptconv.load(folder), gptconv.load(folder)
    compiled = torch.compile(compiled_model)
    ids = random_ids(eager.config.vocab_size, 32, batch=2)
    out_e, out_c = eager(ids), compiled(ids)
    assert (out_e - out_c).abs().max() <= 1e-4
    loss_of(out_e, ids).backward()
    loss_of(out_c, ids).backward()
    for (n, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        assert (p.grad - q.grad).abs().max() <= 1e-5 + 1e-4 * p.grad.abs().max(), n


def test_training_features_gptconv_lacks_are_refused_by_name(families, tmp_path):
    import json
    import shutil
    folder = tmp_path / "phi3"
    shutil.copytree(families["phi3"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "resid_pdrop": 0.1}))
    model = gptconv.load(folder)  # inference is exact without it
    with pytest.raises(gptconv.GptconvError, match="asks for resid_pdrop 0.1, which gptconv does not implement"):
        model.train()
    model.eval()  # eval is always fine


@pytest.mark.parametrize("fixture,name", FAMILIES)
def test_training_after_generating_with_the_same_model(request, fixture, name):
    """Generation runs in inference mode; what a model caches on its first forward there (RoPE
    frequencies) must not stop it training afterwards, nor change what it generates."""
    from gptconv.decoding import generate_ids
    model = gptconv.load(folder_of(request, fixture, name))
    before = generate_ids(model, [1, 2, 3], 5)
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    ids = random_ids(model.config.vocab_size, 12)
    loss_of(model(ids), ids).backward()
    assert all(p.grad is not None for p in model.parameters() if p.dim() > 1)
    model.eval()
    assert generate_ids(model, [1, 2, 3], 5) == before
