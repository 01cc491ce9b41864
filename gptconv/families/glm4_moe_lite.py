"""GLM-4.7-Flash (HF glm4_moe_lite; GGUF deepseek2): DeepSeek-V3's layout (``convert/mla.py``): multi-head
latent attention on every layer, DeepSeek's sigmoid routing with a choice bias and routed scaling, shared
experts ungated; its dense layers named by ``mlp_layer_types`` (the first, by default). Its tokenizer is GLM's:
llama.cpp's converter makes [gMASK] its BOS, <|user|> its end of turn, <|observation|> its end of message (the
family's ``gguf_vocab``). A deepseek2 file tells it is GLM's by those tokens in its vocabulary.
"""

from __future__ import annotations

from typing import Any

from ..convert.hf_config import ConfigFields
from ..convert.hf_keys import DECODER_HF_STEPS
from ..describe import describe_decoder
from ..convert.mla import (deepseek2_config_from_gguf, deepseek2_gguf_keymap, deepseek2_gguf_metadata,
                           glm_vocabulary, mla_config_from_hf, mla_config_to_hf, mla_hf_keymap)
from ..layers.decoder import Decoder, DecoderConfig
from ..layers.mla import MLAShape
from ..layers.mlp import Experts
from ..layers.rope import Rotary
from ..layers.norms import Norms
from .base import Family, Preset

# the tokens llama.cpp's converter gives GLM's special roles, by their text
GLM_SPECIAL = {"bos": "[gMASK]", "eot": "<|user|>", "unk": "<|endoftext|>", "eom": "<|observation|>"}

PRESETS: dict[str, Preset] = {
    # zai-org/GLM-4.7-Flash (its config.json as public projects quote it): 47 layers of 2048, 20 heads, latent 512,
    # 64 experts of 1536 (4 per token) and one shared, the first layer dense
    "glm-4.7-flash": Preset(DecoderConfig(vocab_size=154880, context_length=202752, d_model=2048, n_layers=47,
                                        n_heads=20, n_kv_heads=20, d_ff=10240, head_dim=256,
                                        rope=Rotary(dim=64, theta=1000000.0), norms=Norms(eps=1e-5),
                                        mla=MLAShape(kv_lora_rank=512, qk_nope_dim=192, qk_rope_dim=64, v_head_dim=256, q_lora_rank=768,
                     norm_eps=1e-6),
                                        experts=Experts(64, 4, d_ff=1536, scoring="sigmoid", scaling=1.8, correction_bias=True, shared_d_ff=1536,
                        shared_gate=False),
                                        moe_layers=tuple(i > 0 for i in range(47)), bos_token_id=0, eos_token_id=1,
                                        family="glm4_moe_lite"),
        "zai-org/GLM-4.7-Flash"),
}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    """glm4_moe_lite's config.json: its dense layers in ``mlp_layer_types`` ("dense" / "sparse")."""
    f = ConfigFields(data, origin)
    n = f.int("num_hidden_layers")
    types = f.data.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    if not isinstance(types, list) or len(types) != n or any(t not in ("dense", "sparse") for t in types):
        raise f.error(f"mlp_layer_types must say 'dense' or 'sparse' for each of the {n} layers")
    return mla_config_from_hf(f, "glm4_moe_lite", [t == "dense" for t in types],
                              {"rms_norm_eps": 1e-5, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.8})


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = mla_config_to_hf(c, "glm4_moe_lite", "Glm4MoeLiteForCausalLM")
    out["mlp_layer_types"] = ["sparse" if c.experts_at(i) else "dense" for i in range(c.n_layers)]
    return out


FAMILY = Family(
    name="glm4_moe_lite", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("glm4_moe_lite",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: mla_hf_keymap(c, "glm4_moe_lite"),
    gguf_arch="deepseek2", config_from_gguf=lambda f, t: deepseek2_config_from_gguf(f, t, "glm4_moe_lite"),
    gguf_keymap=deepseek2_gguf_keymap, gguf_metadata=deepseek2_gguf_metadata, claims_gguf=glm_vocabulary,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"special_by_text": GLM_SPECIAL},
)
