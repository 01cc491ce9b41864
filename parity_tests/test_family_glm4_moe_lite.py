"""GLM-4.7-Flash (glm4_moe_lite): DeepSeek-V3's latent attention and routing (``test_family_deepseek_v3.py`` has
the faults each of its steps plants), its dense layers named by mlp_layer_types, its routing in one group, and
GLM's tokenizer roles ([gMASK] BOS, <|user|> end of turn, <|observation|> end of message), which also tell its
deepseek2 file from DeepSeek's. ``family_battery.py`` runs the checks every family passes."""

from __future__ import annotations

import gptconv
from family_battery import *  # noqa: F401,F403 — the battery, collected here against this checkpoint
from gptconv.writers import export

ARCH = "glm4_moe_lite"
VOCAB = "gpt-2-glm"
SHAPE = dict(vocab_size=50304, max_position_embeddings=128, hidden_size=64, intermediate_size=96,
             moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
             n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, mlp_layer_types=["dense", "sparse", "sparse"],
             kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=24, v_head_dim=20,
             routed_scaling_factor=1.8, first_k_dense_replace=1, scoring_func="sigmoid", rope_theta=1000000.0,
             bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
STEPS = ["block.0.latent", "block.1.router"]
# GLM-4.7-Flash, "30B-A3B": 29.9B, 3.9B active (3.3B without the embedding and head)
PRESETS = {"glm-4.7-flash": 29_943_393_920}


def test_its_gguf_reads_as_glm_and_deepseeks_as_deepseek(ours_gguf, tmp_path):
    """A deepseek2 file is GLM-4.7-Flash's where its vocabulary holds GLM's [gMASK] and <|observation|>; GLM's
    end of turn and of message are set; its HF export is glm4_moe_lite's again."""
    from gptconv.convert.mla import glm_vocabulary
    from gptconv.sources.gguf_file import read_fields
    src = gptconv.open_source(str(ours_gguf))
    assert src.config.family == "glm4_moe_lite"
    fields = read_fields(ours_gguf)
    tokens = fields.get("tokenizer.ggml.tokens", list)
    assert tokens[fields.get("tokenizer.ggml.eot_token_id", int)] == "<|user|>"
    assert tokens[fields.get("tokenizer.ggml.eom_token_id", int)] == "<|observation|>"
    assert glm_vocabulary(fields)
    deepseek = gptconv.open_source(str(export(str(ours_gguf), tmp_path / "hf", "safetensors", "f32").out))
    assert deepseek.config.family == "glm4_moe_lite"  # its HF export says glm4_moe_lite in config.json


class _Fields:
    def __init__(self, values):
        self.values, self.path = values, "x.gguf"

    def get(self, key, kind, default=None):
        return self.values.get(key.format(arch="deepseek2") if "{arch}" in key else key, default)


def test_a_deepseek2_file_without_a_gating_function_routes_as_llama_cpp_decides():
    """The converter writes no expert_gating_func for GLM-4.7-Flash (its config.json has no scoring_func):
    llama.cpp then routes by sigmoid for 47 or 48 layers with GLM's 154,880 tokens, by softmax otherwise."""
    from gguf import ExpertGatingFuncType as G
    from gptconv.convert.mla import gating_of
    glm = _Fields({"deepseek2.vocab_size": 154880})
    assert gating_of(glm, 47) == gating_of(glm, 48) == G.SIGMOID
    assert gating_of(glm, 3) == gating_of(_Fields({"deepseek2.vocab_size": 50304}), 47) == G.SOFTMAX
    assert gating_of(_Fields({"deepseek2.expert_gating_func": int(G.SIGMOID)}), 3) == G.SIGMOID
