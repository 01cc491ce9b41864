"""GLM-4.5 (glm4_moe): q/k/v biases, RoPE on the first half of each head, per-head q/k norms (use_qk_norm),
one dense layer then routed experts with DeepSeek's routing (sigmoid scores, a choice bias, 2 of 4 groups,
routed scaling) beside an ungated shared expert, GLM's tokenizer roles. ``family_battery.py`` runs the checks
every family passes."""

from __future__ import annotations

from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint

ARCH = "glm4_moe"
VOCAB = "gpt-2-glm"
SHAPE = dict(vocab_size=50304, max_position_embeddings=128, hidden_size=64, intermediate_size=96, head_dim=32,
             moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             n_shared_experts=1, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
             first_k_dense_replace=1, attention_bias=True, use_qk_norm=True, routed_scaling_factor=2.5,
             num_nextn_predict_layers=1, rope_theta=1000000.0, bos_token_id=50256, eos_token_id=50256,
             pad_token_id=50256)
STEPS = ["block.0.q_norm", "block.1.router"]
# the releases' config.json says 1 MTP layer, which a transformers save leaves out: the converter then needs --no-mtp
CONVERTER_OPTIONS = ("--no-mtp",)
# GLM-4.5-Air, the card's 106B total and 12B active: 106.9B, 13.4B active (12.2B without the embedding and head)
PRESETS = {"glm-4.5-air": 106_852_251_264}


def test_the_mtp_layer_is_dropped_by_name_from_hf_and_from_llama_cpps_gguf(ckpt, tmp_path):
    """GLM-4.5's files hold a multi-token-prediction layer after the trunk (model.layers.{n}, with its own
    embedding, norms, projection and head): dropped by name, as transformers drops it, and listed; the weights
    are the trunk's. llama.cpp's converter (without --no-mtp) writes it as blk.{n} with nextn.* tensors and
    nextn_predict_layers 1: that file reads too, to the same weights."""
    import llama_cpp_tools
    import torch
    import gptconv
    from gptconv.loader import load_source
    from helpers import with_trailing_mtp_layer
    folder = with_trailing_mtp_layer(ckpt, tmp_path / "mtp", 3)
    src = gptconv.open_source(str(folder))
    model, plain = load_source(src), gptconv.load(str(ckpt))
    assert src.config == gptconv.open_source(str(ckpt)).config
    assert {n.split(".")[2] for n in src.dropped} == {"3"} and "model.layers.3.eh_proj.weight" in src.dropped
    assert "model.layers.3.mlp.experts.7.down_proj.weight" in src.dropped and len(src.dropped) > 40
    for (a, x), (b, y) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert a == b and torch.equal(x, y), a  # the trunk's weights, and no other
    theirs = llama_cpp_tools.convert(folder, tmp_path / "theirs.gguf", "f32")
    gguf = gptconv.open_source(str(theirs))
    assert gguf.gguf.fields.get("glm4moe.nextn_predict_layers", int) == 1 and gguf.config.n_layers == 3
    for (a, x), (b, y) in zip(load_source(gguf).state_dict().items(), plain.state_dict().items()):
        assert a == b and torch.equal(x, y), a
    assert "blk.3.nextn.eh_proj.weight" in gguf.dropped
