"""DeepSeek's layout of the decoder with multi-head latent attention (``layers/mla.py``) and DeepSeek's
routing (``mlp.MoE.route``), shared by the families that have it (``families/deepseek_v3.py``, ``glm4_moe_lite.py``):
config.json's MLA and routing fields, YaRN with DeepSeek's mscale on the attention scale, the key tables (the
releases' interleaved rope rows reordered; kv_b_proj split by head), and llama.cpp's deepseek2 (metadata,
tensors: k_b transposed and v_b, as our model holds them).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from gguf import ExpertGatingFuncType, Keys, RopeScalingType

from ..errors import GptconvError, where
from ..layers.decoder import Feature, DecoderConfig
from ..layers.mla import MLAShape
from ..layers.mlp import Experts
from ..layers.rope import RopeScaling
from .gguf_decoder import EXPERTS, add_decoder_hparams, decoder_config_from_gguf
from .gguf_hybrid import SHARED_EXPERT as GGUF_SHARED
from .gguf_meta import T, gguf_name
from .hf_config import ConfigFields
from .hf_decoder import decoder_config_from_hf, decoder_config_to_hf
from .hf_rope import rope_parameters
from .hf_keys import EXPERT_ROWS, MLP, NORMS, decoder_hf_keymap, fused_experts
from .keymap import Fuse, Fused, KeyMap, Map, Transform, Tied
from .mtp import trunk_layers, with_dropped_mtp

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields


def mla_scale(qk_head_dim: int, scaling: RopeScaling | None, mscale_all_dim: float) -> float:
    """The scores' scale: (nope + rope)^-½, × (0.1 · mscale_all_dim · ln factor + 1)² under YaRN (DeepSeek's)."""
    scale = qk_head_dim ** -0.5
    if scaling is not None and scaling.kind == "yarn" and mscale_all_dim and scaling.factor > 1:
        scale *= (0.1 * mscale_all_dim * math.log(scaling.factor) + 1.0) ** 2
    return scale


MLA_HAS = frozenset({Feature.PARTIAL_ROTARY, Feature.YARN, Feature.MLA, Feature.SIGMOID_ROUTER, Feature.EXPERT_GROUPS,
                     Feature.ROUTED_SCALING, Feature.CORRECTION_BIAS, Feature.UNGATED_SHARED_EXPERT, Feature.SHARED_EXPERT,
                     Feature.EXPERT_SIZE, Feature.DENSE_AMONG_EXPERTS})


# transformers' DeepseekV3Attention (and GLM-4.7-Flash's, which is it) builds the latents' RMSNorms with its
# default epsilon whatever rms_norm_eps says; llama.cpp's deepseek2 uses rms_norm_eps for them
LATENT_NORM_EPS = 1e-6


def mla_config_from_hf(f: ConfigFields, family: str, dense: list[bool], defaults: dict[str, Any]) -> DecoderConfig:
    """The config of a model_type of DeepSeek's layout: ``dense`` says which layers have a dense MLP (the
    family reads it: first_k_dense_replace, mlp_layer_types); ``defaults``: transformers' values of the
    family for fields a config.json may leave out (n_group, topk_group, routed_scaling_factor, rms_norm_eps)."""
    if not f.bool("rope_interleave", True):
        raise f.error("rope_interleave false (the rotated rows already in halves) is not supported")
    heads = f.int("num_attention_heads")
    if f.positive("num_key_value_heads", heads) != heads:
        raise f.error("num_key_value_heads other than num_attention_heads: MLA has a key and value per head")
    for name, allowed in (("scoring_func", ("sigmoid",)), ("topk_method", ("noaux_tc", "greedy", "group_limited_greedy"))):
        if name in f.data and f.data[name] not in allowed:
            raise f.error(f"{name} '{f.data[name]}' is not supported ({', '.join(allowed)})")
    nope, rope, q_lora = f.positive("qk_nope_head_dim", 128), f.positive("qk_rope_head_dim", 64), f.data.get("q_lora_rank")
    shared, moe_d_ff = f.int("n_shared_experts", 1), f.positive("moe_intermediate_size", 2048)
    groups = (f.positive("n_group", defaults["n_group"]), f.positive("topk_group", defaults["topk_group"]))
    bias = f.bool("attention_bias", False)
    data = {**f.data, "head_dim": nope + rope}
    config = decoder_config_from_hf(ConfigFields(data, f.origin), family, defaults,
                                    attention=dict(qkv_bias=bias, o_bias=bias), rope=dict(dim=rope),
                                    moe_layers=tuple(not d for d in dense),
                                    experts=Experts(f.positive("n_routed_experts", 256), f.positive("num_experts_per_tok", 8), moe_d_ff,
                        renormalise=f.bool("norm_topk_prob", True), scoring="sigmoid", groups=groups,
                        scaling=f.float("routed_scaling_factor", defaults["routed_scaling_factor"]),
                        correction_bias=True, shared_d_ff=shared * moe_d_ff, shared_gate=False),
                                    mla=MLAShape(kv_lora_rank=f.positive("kv_lora_rank", 512), qk_nope_dim=nope, qk_rope_dim=rope,
                     v_head_dim=f.positive("v_head_dim", 128), q_lora_rank=0 if q_lora is None else int(q_lora),
                     scale=1.0, norm_eps=LATENT_NORM_EPS))
    p = rope_parameters(f)
    m_all = p.float("mscale_all_dim", 0.0) if config.rope.scaling is not None else 0.0
    return replace(config, mla=replace(config.mla, scale=mla_scale(nope + rope, config.rope.scaling, m_all)))


def mla_config_to_hf(c: DecoderConfig, model_type: str, hf_class: str) -> dict[str, Any]:
    """The fields every model_type of DeepSeek's layout has (the family adds how it says its dense layers)."""
    _check(c, f"HF's {model_type}")
    out = decoder_config_to_hf(c, model_type, hf_class, biases=(c.attention.qkv_bias, c.attention.o_bias, False), experts=True,
                               has=MLA_HAS)
    m, e = c.mla, c.experts
    out["rope_parameters"].pop("partial_rotary_factor", None)
    s = c.rope.scaling
    if s is not None and s.kind == "yarn":  # DeepSeek's mscale: the attention scale's, read back from it
        m_all = _mscale_all_dim(c)
        out["rope_parameters"].update(mscale=m_all, mscale_all_dim=m_all)
        out["rope_parameters"].pop("attention_factor", None)
    out.update(head_dim=m.qk_rope_dim, qk_nope_head_dim=m.qk_nope_dim, qk_rope_head_dim=m.qk_rope_dim,
               v_head_dim=m.v_head_dim, kv_lora_rank=m.kv_lora_rank, q_lora_rank=m.q_lora_rank or None,
               n_routed_experts=e.count, num_experts_per_tok=e.used,
               moe_intermediate_size=e.d_ff, n_shared_experts=e.shared_d_ff // e.d_ff,
               n_group=e.groups[0], topk_group=e.groups[1],
               routed_scaling_factor=e.scaling, norm_topk_prob=e.renormalise, rope_interleave=True,
               scoring_func="sigmoid", topk_method="noaux_tc", num_mtp_layers=0)
    return out


def _mscale_all_dim(c: DecoderConfig) -> float:
    """mscale_all_dim from the attention scale (it is (0.1 · m · ln factor + 1)² × head^-½)."""
    ratio = c.mla.scale / c.mla.qk_head_dim ** -0.5
    return (math.sqrt(ratio) - 1.0) / (0.1 * math.log(c.rope.scaling.factor)) if c.rope.scaling.factor > 1 else 0.0


def _check(c: DecoderConfig, where_to: str) -> None:
    """What DeepSeek's layer always is: latent attention, sigmoid routing with its bias, dense layers first
    then experts, the shared experts ungated and a whole number of the expert size."""
    dense, e = [not c.experts_at(i) for i in range(c.n_layers)], c.experts
    if e is None:
        raise ValueError(f"{where_to} has no place for a model without routed experts")
    problems = [what for what, bad in (
        ("attention other than latent attention", c.mla is None),
        ("routing other than DeepSeek's sigmoid", e.scoring != "sigmoid" or not e.correction_bias),
        ("dense layers after the first expert layer", dense != sorted(dense, reverse=True)),
        ("a gated shared expert", bool(e.shared_d_ff) and e.shared_gate),
        ("shared experts that are not a whole number of experts", bool(e.d_ff) and e.shared_d_ff % e.d_ff),
        ("a window", c.attention.window is not None)) if bad]
    if problems:
        raise ValueError(f"{where_to} has no place for {problems[0]}")


def _rope_rows(t: torch.Tensor, groups: int, rope: int, to_halves: bool) -> torch.Tensor:
    """Each of ``groups`` row groups ends with ``rope`` rows of the rotated part: reorder them from interleaved
    pairs (x0, x1), (x2, x3), … into halves (x0, x2, …, x1, x3, …) (``to_halves``), or back."""
    shape = t.shape
    v = t.reshape(groups, shape[0] // groups, *shape[1:])
    keep, rest = v.shape[1] - rope, v.shape[2:]
    pairs = (rope // 2, 2) if to_halves else (2, rope // 2)
    rot = v[:, keep:].reshape(groups, *pairs, *rest).transpose(1, 2).reshape(groups, rope, *rest)
    return torch.cat((v[:, :keep], rot), 1).reshape(shape)


def _rope_rows_transform(name: str, groups) -> Transform:
    return Transform(name, lambda t, c: _rope_rows(t, groups(c), c.mla.qk_rope_dim, True),
                     lambda t, c: _rope_rows(t, groups(c), c.mla.qk_rope_dim, False))


Q_ROWS = _rope_rows_transform("q_rope_rows_interleaved", lambda c: c.n_heads)  # each head's q ends with its rope rows
KV_A_ROWS = _rope_rows_transform("kv_a_rope_rows_interleaved", lambda c: 1)  # the latent's rows, then the rope rows

# HF's kv_b_proj (heads × (nope + v), r): each head's k_b rows, then its v_b rows
_KV_B = Fuse(
    "kv_b_by_head",
    lambda t, c: [p.reshape(-1, t.shape[-1]) for p in t.view(c.n_heads, -1, t.shape[-1]).split(
        (c.mla.qk_nope_dim, c.mla.v_head_dim), 1)],
    lambda ts, c: torch.cat((ts[0].view(c.n_heads, -1, ts[0].shape[-1]), ts[1].view(c.n_heads, -1, ts[1].shape[-1])),
                            1).reshape(-1, ts[0].shape[-1]),
    lambda s, c: ([(c.n_heads * c.mla.qk_nope_dim, s[1]), (c.n_heads * c.mla.v_head_dim, s[1])]
                  if len(s) == 2 and s[0] == c.n_heads * (c.mla.qk_nope_dim + c.mla.v_head_dim) else [s]))


def mla_hf_keymap(c: DecoderConfig, model_type: str) -> KeyMap:
    attention = [("self_attn.q_a_layernorm.weight", "attn.q_a_norm.weight"),
                 ("self_attn.kv_a_layernorm.weight", "attn.kv_a_norm.weight"),
                 *((f"self_attn.{src}.{p}", f"attn.{dst}.{p}") for src, dst in (("q_a_proj", "q_a"), ("o_proj", "o"))
                   for p in ("weight", "bias"))]
    shared = [(f"mlp.shared_experts.{n}_proj.weight", f"mlp.shared.{n}.weight") for n in ("gate", "up", "down")]
    rows = [Map("model.layers.{i}.self_attn.q_b_proj.weight", "blocks.{i}.attn.q_b.weight", Q_ROWS),
            Map("model.layers.{i}.self_attn.q_proj.weight", "blocks.{i}.attn.q.weight", Q_ROWS),
            *(Map(f"model.layers.{{i}}.self_attn.kv_a_proj_with_mqa.{p}", f"blocks.{{i}}.attn.kv_a.{p}", KV_A_ROWS)
              for p in ("weight", "bias")),
            Fused("model.layers.{i}.self_attn.kv_b_proj.weight", ["blocks.{i}.attn.k_b.weight",
                                                                 "blocks.{i}.attn.v_b.weight"], _KV_B),
            Map("model.layers.{i}.mlp.gate.e_score_correction_bias", "blocks.{i}.mlp.correction")]
    return with_dropped_mtp(decoder_hf_keymap(c, model_type, NORMS + attention + MLP + EXPERT_ROWS + shared,
                                              rows + fused_experts(c)), c.n_layers)


# llama.cpp's k_b: (heads, r, nope) per head transposed; v_b: (heads, v, r)
_K_B = Transform("k_b_by_head_transposed",
                 lambda t, c: t.transpose(1, 2).reshape(-1, t.shape[1]),
                 lambda t, c: t.view(c.n_heads, -1, t.shape[1]).transpose(1, 2).contiguous(),
                 lambda s, c: (s[0] * s[2], s[1]) if len(s) == 3 else (-1,))
_V_B = Transform("v_b_by_head", lambda t, c: t.reshape(-1, t.shape[2]),
                 lambda t, c: t.view(c.n_heads, -1, t.shape[1]),
                 lambda s, c: (s[0] * s[1], s[2]) if len(s) == 3 else (-1,))


def deepseek2_gguf_keymap(c: DecoderConfig) -> KeyMap:
    head = (Tied(gguf_name(T.OUTPUT), "tok_emb.weight") if c.tie_embeddings
            else Map(gguf_name(T.OUTPUT), "lm_head.weight"))
    layer = [Map(gguf_name(T.ATTN_NORM), "blocks.{i}.norm1.weight"), Map(gguf_name(T.FFN_NORM), "blocks.{i}.norm2.weight"),
             Map(gguf_name(T.ATTN_Q_A), "blocks.{i}.attn.q_a.weight"),
             Map(gguf_name(T.ATTN_Q_A_NORM), "blocks.{i}.attn.q_a_norm.weight"),
             Map(gguf_name(T.ATTN_Q_B), "blocks.{i}.attn.q_b.weight", Q_ROWS),
             Map(gguf_name(T.ATTN_Q), "blocks.{i}.attn.q.weight", Q_ROWS),
             Map(gguf_name(T.ATTN_KV_A_MQA), "blocks.{i}.attn.kv_a.weight", KV_A_ROWS),
             Map(gguf_name(T.ATTN_KV_A_NORM), "blocks.{i}.attn.kv_a_norm.weight"),
             Map(gguf_name(T.ATTN_K_B), "blocks.{i}.attn.k_b.weight", _K_B),
             Map(gguf_name(T.ATTN_V_B), "blocks.{i}.attn.v_b.weight", _V_B),
             Map(gguf_name(T.ATTN_OUT), "blocks.{i}.attn.o.weight"),
             *(Map(gguf_name(src), f"blocks.{{i}}.mlp.{dst}.weight")
               for src, dst in ((T.FFN_GATE, "gate"), (T.FFN_UP, "up"), (T.FFN_DOWN, "down"))),
             *EXPERTS, Map(gguf_name(T.FFN_EXP_PROBS_B, "bias"), "blocks.{i}.mlp.correction"),
             *(r for r in GGUF_SHARED if "shared_gate" not in r.target)]
    return with_dropped_mtp(KeyMap("deepseek2 (GGUF)", [Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"), *layer,
                                                         Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight"), head]),
                            c.n_layers, gguf=True)


def gating_of(f: GGUFFields, n_layers: int) -> int:
    """The routing llama.cpp runs a deepseek2 file with: expert_gating_func, or where the file has none (the
    converter writes it only where config.json says scoring_func; GLM-4.7-Flash's does not), sigmoid for 47 or
    48 layers with GLM's 154,880-token vocabulary and softmax (DeepSeek-V2's) otherwise, as llama.cpp decides."""
    gating = f.get(Keys.LLM.EXPERT_GATING_FUNC, int, 0)
    if gating:
        return gating
    vocab = f.get(Keys.LLM.VOCAB_SIZE, int, 0) or len(f.get(Keys.Tokenizer.LIST, list, []))
    glm = n_layers in (47, 48) and vocab == 154880
    return ExpertGatingFuncType.SIGMOID if glm else ExpertGatingFuncType.SOFTMAX


def deepseek_experts(f: GGUFFields, moe_d_ff: int) -> Experts:
    """DeepSeek's routed experts as llama.cpp's deepseek2 and glm4moe files give them: sigmoid scores with
    the correction bias, groups, the weights' scale and renormalisation, ungated shared experts."""
    return Experts(f.get(Keys.LLM.EXPERT_COUNT, int), f.get(Keys.LLM.EXPERT_USED_COUNT, int), moe_d_ff,
                   renormalise=f.get(Keys.LLM.EXPERT_WEIGHTS_NORM, bool, False), scoring="sigmoid",
                   groups=(f.get(Keys.LLM.EXPERT_GROUP_COUNT, int, 1), f.get(Keys.LLM.EXPERT_GROUP_USED_COUNT, int, 1)),
                   scaling=f.get(Keys.LLM.EXPERT_WEIGHTS_SCALE, float, 1.0), correction_bias=True,
                   shared_d_ff=f.get(Keys.LLM.EXPERT_SHARED_COUNT, int) * moe_d_ff, shared_gate=False)


def deepseek2_config_from_gguf(f: GGUFFields, tensors: dict, family: str) -> DecoderConfig:
    """llama.cpp's deepseek2: the MLA sizes from its own keys, sigmoid routing (expert_gating_func), the
    dense layers first, DeepSeek's YaRN mscale from yarn_log_mul."""
    n = trunk_layers(f, tensors)  # the MTP blocks after them are dropped (``with_dropped_mtp``)
    if gating_of(f, n) != ExpertGatingFuncType.SIGMOID:
        raise where(f.path, "deepseek2 routing other than sigmoid (expert_gating_func: DeepSeek-V2's softmax) is "
                            "not supported")
    k_len, v_len = f.get(Keys.Attention.KEY_LENGTH_MLA, int), f.get(Keys.Attention.VALUE_LENGTH_MLA, int)
    rope = f.get(Keys.Rope.DIMENSION_COUNT, int)
    heads = f.get(Keys.Attention.HEAD_COUNT, int)
    dense = f.get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, int, 0)
    moe_d_ff = f.get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int)
    config = decoder_config_from_gguf(
        f, tensors, family, partial_rotary=True, head_dim=k_len, yarn_log_mul=True, n_kv_heads=heads, n_layers=n,
        moe_layers=tuple(i >= dense for i in range(n)), experts=deepseek_experts(f, moe_d_ff),
        mla=MLAShape(kv_lora_rank=f.get(Keys.Attention.KV_LORA_RANK, int), qk_nope_dim=k_len - rope,
                     qk_rope_dim=rope, v_head_dim=v_len, q_lora_rank=f.get(Keys.Attention.Q_LORA_RANK, int, 0),
                     scale=1.0))
    m_all = f.get(Keys.Rope.SCALING_YARN_LOG_MUL, float, 0.0) / 0.1
    return replace(config, mla=replace(config.mla, scale=mla_scale(k_len, config.rope.scaling, m_all)))


def deepseek2_gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter: the generic keys (K/V heads 1: its MLA is MQA over the latent), then its MLA
    and expert keys, DeepSeek's YaRN."""
    try:
        _check(c, "llama.cpp's deepseek2")
    except ValueError as e:
        raise GptconvError(f"{e}; not exported") from None
    m = c.mla
    dense = next((i for i in range(c.n_layers) if c.experts_at(i)), c.n_layers)
    add_decoder_hparams(w, c, has=MLA_HAS, arch="deepseek2", kv_heads=1)
    s = c.rope.scaling
    if s is not None and s.kind == "yarn":
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(s.factor)
        w.add_rope_scaling_orig_ctx_len(s.original_context_length)
        w.add_rope_scaling_yarn_beta_fast(s.beta_fast)
        w.add_rope_scaling_yarn_beta_slow(s.beta_slow)
    e = c.experts
    if e:
        w.add_expert_group_count(e.groups[0])
        w.add_expert_group_used_count(e.groups[1])
    w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    w.add_leading_dense_block_count(dense)
    w.add_vocab_size(c.vocab_size)
    if m.q_lora_rank:
        w.add_q_lora_rank(m.q_lora_rank)
    w.add_kv_lora_rank(m.kv_lora_rank)
    w.add_key_length(m.kv_lora_rank + m.qk_rope_dim)
    w.add_value_length(m.kv_lora_rank)
    w.add_key_length_mla(m.qk_head_dim)
    w.add_value_length_mla(m.v_head_dim)
    w.add_expert_feed_forward_length(e.d_ff)
    w.add_expert_shared_count(e.shared_d_ff // e.d_ff)
    w.add_expert_weights_scale(e.scaling)
    if e.renormalise:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(m.qk_rope_dim)
    if s is not None and s.kind == "yarn":
        w.add_rope_scaling_yarn_log_mul(0.1 * _mscale_all_dim(c))


def glm_vocabulary(f: GGUFFields) -> bool:
    """Whether a GGUF's vocabulary is GLM's: it holds GLM's special tokens [gMASK] and <|observation|>."""
    tokens = f.get(Keys.Tokenizer.LIST, list, [])
    return "[gMASK]" in tokens and "<|observation|>" in tokens
