"""DeepSeek-V3 (HF deepseek_v3: DeepSeek-V3/R1, Kimi K2, Moonlight; GGUF deepseek2): the decoder with
multi-head latent attention on every layer (``layers/mla.py``) and, after the first ``first_k_dense_replace``
dense layers, routed experts with DeepSeek's routing (``mlp.MoE.route``): sigmoid scores, a learned bias on the
choice only (``e_score_correction_bias``), the best ``topk_group`` of ``n_group`` groups first, the chosen
weights renormalised and × ``routed_scaling_factor``; shared experts (``n_shared_experts`` × the expert size)
on every token, ungated. YaRN with DeepSeek's mscale: the attention scale × (0.1 · mscale_all_dim · ln factor
+ 1)².

HF files store each head's q and kv_a rows of the rotated part in interleaved pairs (``rope_interleave``, the
releases' layout); the key tables reorder them into the halves our RoPE rotates. llama.cpp's deepseek2 holds
the same interleaved rows (its NORM RoPE), and kv_b_proj split by head into k_b (transposed) and v_b, as our
model holds it.
"""

from __future__ import annotations

from typing import Any

from ..convert.hf_config import ConfigFields
from ..convert.hf_keys import DECODER_HF_STEPS
from ..describe import describe_decoder
from ..convert.mla import (deepseek2_config_from_gguf, deepseek2_gguf_keymap, deepseek2_gguf_metadata,
                           glm_vocabulary, mla_config_from_hf, mla_config_to_hf, mla_hf_keymap, mla_scale)
from ..layers.decoder import Decoder, DecoderConfig
from ..layers.mla import MLAShape
from ..layers.mlp import Experts
from ..layers.rope import RopeScaling, Rotary
from ..layers.norms import Norms
from .base import Family, Preset


def _deepseek(vocab: int, d: int, layers: int, heads: int, d_ff: int, experts: int, moe_d_ff: int, dense: int,
              groups: tuple[int, int], scaling: float, q_lora: int, context: int, yarn: RopeScaling | None,
              theta: float, bos: int, eos: int) -> DecoderConfig:
    mla = MLAShape(kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, q_lora_rank=q_lora,
                   scale=mla_scale(192, yarn, 1.0))
    return DecoderConfig(vocab_size=vocab, context_length=context, d_model=d, n_layers=layers, n_heads=heads,
                       n_kv_heads=heads, d_ff=d_ff, head_dim=192, rope=Rotary(dim=64, theta=theta, scaling=yarn),
                       norms=Norms(eps=1e-6), mla=mla, moe_layers=tuple(i >= dense for i in range(layers)),
                       experts=Experts(experts, 8, moe_d_ff, scoring="sigmoid", groups=groups, scaling=scaling,
                                       correction_bias=True, shared_d_ff=moe_d_ff, shared_gate=False),
                       bos_token_id=bos, eos_token_id=eos, family="deepseek_v3")


_YARN_40 = RopeScaling("yarn", factor=40.0, original_context_length=4096, attention_factor=1.0)
_YARN_32 = RopeScaling("yarn", factor=32.0, original_context_length=4096, attention_factor=1.0, beta_fast=1.0,
                       beta_slow=1.0)
PRESETS: dict[str, Preset] = {
    # deepseek-ai/DeepSeek-V3: 61 layers of 7168 (3 dense), 128 heads, 256 experts of 2048 (8 per token, groups
    # 4 of 8) and one shared; the card's 671B are these 671.0B without the MTP layer (14B more)
    "deepseek-v3": Preset(_deepseek(129280, 7168, 61, 128, 18432, 256, 2048, 3, (8, 4), 2.5, 1536, 163840,
                                    _YARN_40, 10000.0, 0, 1), "deepseek-ai/DeepSeek-V3"),
    # moonshotai/Kimi-K2-Instruct: DeepSeek-V3's design at 1T: 384 experts, 64 heads, 1 dense layer, one group
    "kimi-k2": Preset(_deepseek(163840, 7168, 61, 64, 18432, 384, 2048, 1, (1, 1), 2.827, 1536, 131072,
                                _YARN_32, 50000.0, 163584, 163585), "moonshotai/Kimi-K2-Instruct"),
}

def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    """DeepSeek-V3's config.json: the first ``first_k_dense_replace`` layers dense."""
    f = ConfigFields(data, origin)
    dense = f.int("first_k_dense_replace", 3)
    return mla_config_from_hf(f, "deepseek_v3", [i < dense for i in range(f.int("num_hidden_layers"))],
                              {"rms_norm_eps": 1e-6, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5})


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = mla_config_to_hf(c, "deepseek_v3", "DeepseekV3ForCausalLM")
    out["first_k_dense_replace"] = next((i for i in range(c.n_layers) if c.experts_at(i)), c.n_layers)
    return out


FAMILY = Family(
    name="deepseek_v3", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    # Kimi K2's config.json says kimi_k2 (its own code's name; transformers reads it as deepseek_v3)
    hf_model_types=("deepseek_v3", "kimi_k2"), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=lambda c: mla_hf_keymap(c, "deepseek_v3"),
    gguf_arch="deepseek2", config_from_gguf=lambda f, t: deepseek2_config_from_gguf(f, t, "deepseek_v3"),
    gguf_keymap=deepseek2_gguf_keymap, gguf_metadata=deepseek2_gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    # a deepseek2 file of GLM-4.7-Flash says so by GLM's special tokens in its vocabulary: ``glm4_moe_lite.py``
    claims_gguf=lambda fields: not glm_vocabulary(fields),
)
