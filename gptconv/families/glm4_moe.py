"""GLM-4.5 / 4.6 / 4.7 (HF glm4_moe; GGUF glm4moe): the decoder with q/k/v biases (no output bias), RoPE on
the first half of each head (``partial_rotary_factor`` 0.5), per-head q/k RMSNorms where ``use_qk_norm`` says,
and DeepSeek-V3's routing (``mlp.MoE.route``: sigmoid scores, a bias on the choice, groups, routed scaling) over
routed experts beside ungated shared experts, after ``first_k_dense_replace`` dense layers. llama.cpp's glm4moe
holds the same rows (q and k in HF's rotate-half order) and routes by sigmoid (its converter always says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import ExpertGatingFuncType, Keys

from ..convert.gguf_decoder import (EXPERTS, QK_NORM as GGUF_QK_NORM, add_decoder_hparams, add_key_length,
                                    decoder_config_from_gguf, decoder_gguf_keymap, standard_layer)
from ..convert.gguf_hybrid import SHARED_EXPERT as GGUF_SHARED
from ..convert.gguf_meta import T, gguf_name
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf
from ..convert.hf_rope import rope_parameters
from ..convert.hf_keys import (ATTENTION, DECODER_HF_STEPS, EXPERT_ROWS, MLP, NORMS, QK_NORM, decoder_hf_keymap,
                               fused_experts)
from ..describe import describe_decoder
from ..convert.keymap import KeyMap, Map
from ..convert.mla import deepseek_experts
from ..convert.mtp import trunk_layers, with_dropped_mtp
from ..errors import GptconvError, where
from ..layers.decoder import Feature, Decoder, DecoderConfig
from ..layers.mlp import Experts
from ..layers.rope import Rotary
from ..layers.norms import Norms
from ..layers.attention import AttentionOptions
from .base import Family, Preset
from .glm4_moe_lite import GLM_SPECIAL

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

PRESETS: dict[str, Preset] = {
    # zai-org/GLM-4.5-Air: 46 layers of 4096 (the first dense), 96 heads of 128 (8 K/V), 128 experts of 1408 (8 per
    # token) and one shared, routed × 1; its config.json as public projects quote it (its MTP layer not counted)
    "glm-4.5-air": Preset(DecoderConfig(vocab_size=151552, context_length=131072, d_model=4096, n_layers=46, n_heads=96,
                                      n_kv_heads=8, d_ff=10944, head_dim=128, rope=Rotary(dim=64, theta=1000000.0),
                                      norms=Norms(eps=1e-5), attention=AttentionOptions(qkv_bias=True),
                                      experts=Experts(128, 8, d_ff=1408, shared_d_ff=1408, shared_gate=False, scoring="sigmoid", correction_bias=True),
                                      moe_layers=tuple(i > 0 for i in range(46)), bos_token_id=None,
                                      eos_token_id=151329, family="glm4_moe"), "zai-org/GLM-4.5-Air"),
}

_HAS = frozenset({Feature.PARTIAL_ROTARY, Feature.SIGMOID_ROUTER, Feature.EXPERT_GROUPS, Feature.ROUTED_SCALING, Feature.CORRECTION_BIAS,
                  Feature.UNGATED_SHARED_EXPERT, Feature.SHARED_EXPERT, Feature.EXPERT_SIZE, Feature.DENSE_AMONG_EXPERTS})
_ROUTER = [("mlp.gate.e_score_correction_bias", "mlp.correction")]
_SHARED = [(f"mlp.shared_experts.{n}_proj.weight", f"mlp.shared.{n}.weight") for n in ("gate", "up", "down")]


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    if "partial_rotary_factor" not in rope_parameters(f).data:  # transformers' default for glm4_moe
        f = ConfigFields({**data, "partial_rotary_factor": 0.5}, origin)
    n = f.int("num_hidden_layers")
    dense = f.int("first_k_dense_replace", 1)
    moe_d_ff = f.positive("moe_intermediate_size", 1408)
    return decoder_config_from_hf(f, "glm4_moe", {"rms_norm_eps": 1e-5}, partial_rotary=True,
                                  attention=dict(qkv_bias=f.bool("attention_bias", False), qk_norm=f.bool("use_qk_norm", False)),
                                  moe_layers=tuple(i >= dense for i in range(n)),
                                  experts=Experts(f.positive("n_routed_experts", 128), f.positive("num_experts_per_tok", 8), moe_d_ff,
                        renormalise=f.bool("norm_topk_prob", True), scoring="sigmoid",
                        groups=(f.positive("n_group", 1), f.positive("topk_group", 1)),
                        scaling=f.float("routed_scaling_factor", 1.0), correction_bias=True,
                        shared_d_ff=f.int("n_shared_experts", 1) * moe_d_ff, shared_gate=False))


def _check(c: DecoderConfig, where_to: str) -> None:
    dense, e = [not c.experts_at(i) for i in range(c.n_layers)], c.experts
    if e is None:
        raise ValueError(f"{where_to} has no place for a model without routed experts")
    problems = [what for what, bad in (
        ("routing other than DeepSeek's sigmoid", e.scoring != "sigmoid" or not e.correction_bias),
        ("dense layers after the first expert layer", dense != sorted(dense, reverse=True)),
        ("a gated shared expert", bool(e.shared_d_ff) and e.shared_gate),
        ("shared experts that are not a whole number of experts", e.shared_d_ff % (e.d_ff or c.d_ff)),
        ("an output bias", c.attention.o_bias), ("a window", c.attention.window is not None)) if bad]
    if problems:
        raise ValueError(f"{where_to} has no place for {problems[0]}")


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    _check(c, "HF's glm4_moe")
    out = decoder_config_to_hf(c, "glm4_moe", "Glm4MoeForCausalLM", biases=(c.attention.qkv_bias, False, False),
                               qk_norm=c.attention.qk_norm, experts=True, has=_HAS)
    e = c.experts
    out.update(use_qk_norm=c.attention.qk_norm, n_routed_experts=e.count, num_experts_per_tok=e.used,
               moe_intermediate_size=e.d_ff, n_shared_experts=e.shared_d_ff // e.d_ff,
               first_k_dense_replace=next((i for i in range(c.n_layers) if c.experts_at(i)), c.n_layers),
               n_group=e.groups[0], topk_group=e.groups[1], routed_scaling_factor=e.scaling,
               norm_topk_prob=e.renormalise, num_nextn_predict_layers=0)
    return out


def hf_keymap(c: DecoderConfig) -> KeyMap:
    """The releases' MTP layer (model.layers.{n}) is dropped by name, as transformers drops it."""
    return with_dropped_mtp(decoder_hf_keymap(c, "glm4_moe", NORMS + ATTENTION + QK_NORM + MLP + EXPERT_ROWS + _ROUTER
                                              + _SHARED, fused_experts(c)), c.n_layers)


def gguf_keymap(c: DecoderConfig) -> KeyMap:
    return with_dropped_mtp(decoder_gguf_keymap(c, "glm4moe", standard_layer(permuted=False) + GGUF_QK_NORM + EXPERTS + [
        Map(gguf_name(T.FFN_EXP_PROBS_B, "bias"), "blocks.{i}.mlp.correction"),
        *(r for r in GGUF_SHARED if "shared_gate" not in r.target)], norm2=T.ATTN_POST_NORM), c.n_layers, gguf=True)


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """llama.cpp's glm4moe: sigmoid routing, the dense layers first, q/k norms where the file has them."""
    if f.get(Keys.LLM.EXPERT_GATING_FUNC, int, ExpertGatingFuncType.SIGMOID) != ExpertGatingFuncType.SIGMOID:
        raise where(f.path, "glm4moe routing other than sigmoid is not supported")
    n = trunk_layers(f, tensors)  # the MTP blocks after them (nextn_predict_layers) are dropped
    dense = f.get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, int, 0)
    moe_d_ff = f.get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int)
    return decoder_config_from_gguf(f, tensors, "glm4_moe", partial_rotary=True, n_layers=n,
                                    attention=dict(qk_norm=gguf_name(T.ATTN_Q_NORM).replace("{i}", "0") in tensors),
                                    moe_layers=tuple(i >= dense for i in range(n)),
                                    experts=deepseek_experts(f, moe_d_ff))


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter: the generic keys, the group counts, the key length, then its glm4moe keys."""
    try:
        _check(c, "llama.cpp's glm4moe")
    except ValueError as e:
        raise GptconvError(f"{e}; not exported") from None
    add_decoder_hparams(w, c, has=_HAS | {Feature.LAYER_TYPES}, arch="glm4moe")
    e = c.experts
    w.add_expert_group_count(e.groups[0])
    w.add_expert_group_used_count(e.groups[1])
    add_key_length(w, c, always=True)
    w.add_rope_dimension_count(c.rope.dim or c.head_dim)
    w.add_expert_feed_forward_length(e.d_ff)
    w.add_expert_shared_count(e.shared_d_ff // e.d_ff)
    w.add_leading_dense_block_count(next((i for i in range(c.n_layers) if c.experts_at(i)), c.n_layers))
    w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(e.scaling)
    w.add_expert_weights_norm(e.renormalise)


FAMILY = Family(
    name="glm4_moe", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("glm4_moe",), config_from_hf=config_from_hf, config_to_hf=config_to_hf, hf_keymap=hf_keymap,
    gguf_arch="glm4moe", config_from_gguf=config_from_gguf, gguf_keymap=gguf_keymap, gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"special_by_text": GLM_SPECIAL},
)
