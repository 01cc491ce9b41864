"""DeepSeek-V3 (HF deepseek_v3: DeepSeek-V3/R1, Kimi K2, Moonlight; GGUF deepseek2): the Llama decoder with
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

import math
from dataclasses import replace
from typing import Any

import torch
from gguf import ExpertGatingFuncType, Keys, RopeScalingType

from ..convert.gguf_decoder import EXPERTS, add_decoder_hparams, decoder_config_from_gguf
from ..convert.gguf_hybrid import SHARED_EXPERT as GGUF_SHARED
from ..convert.gguf_meta import T, gguf_name
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import (DECODER_HF_STEPS, EXPERT_ROWS, MLP, NORMS, decoder_config_from_hf,
                                  decoder_config_to_hf, decoder_hf_keymap, describe_decoder, fused_experts,
                                  rope_parameters)
from ..convert.keymap import Fuse, Fused, KeyMap, Map, Transform, Tied
from ..errors import GptconvError, where
from ..layers.decoder import Llama, LlamaConfig
from ..layers.mla import MLAShape
from ..layers.rope import RopeScaling
from .base import Family, Preset


def mla_scale(qk_head_dim: int, scaling: RopeScaling | None, mscale_all_dim: float) -> float:
    """The scores' scale: (nope + rope)^-½, × (0.1 · mscale_all_dim · ln factor + 1)² under YaRN (DeepSeek's)."""
    scale = qk_head_dim ** -0.5
    if scaling is not None and scaling.kind == "yarn" and mscale_all_dim and scaling.factor > 1:
        scale *= (0.1 * mscale_all_dim * math.log(scaling.factor) + 1.0) ** 2
    return scale


def _deepseek(vocab: int, d: int, layers: int, heads: int, d_ff: int, experts: int, moe_d_ff: int, dense: int,
              groups: tuple[int, int], scaling: float, q_lora: int, context: int, yarn: RopeScaling | None,
              theta: float, bos: int, eos: int) -> LlamaConfig:
    mla = MLAShape(kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, q_lora_rank=q_lora,
                   scale=mla_scale(192, yarn, 1.0))
    return LlamaConfig(vocab_size=vocab, context_length=context, d_model=d, n_layers=layers, n_heads=heads,
                       n_kv_heads=heads, d_ff=d_ff, head_dim=192, rope_dim=64, norm_eps=1e-6, rope_theta=theta,
                       rope_scaling=yarn, mla=mla, n_experts=experts, n_experts_used=8, moe_d_ff=moe_d_ff,
                       moe_layers=tuple(i >= dense for i in range(layers)), shared_expert_d_ff=moe_d_ff,
                       shared_expert_gate=False, router_scoring="sigmoid", expert_groups=groups,
                       routed_scaling=scaling, router_correction_bias=True, bos_token_id=bos, eos_token_id=eos,
                       family="deepseek_v3")


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

_HAS = frozenset({"partial rotary", "yarn", "multi-head latent attention", "sigmoid router", "expert groups",
                  "routed scaling", "router correction bias", "ungated shared expert", "shared expert",
                  "expert size", "dense layers among experts"})


def config_from_hf(data: dict[str, Any], origin: object) -> LlamaConfig:
    f = ConfigFields(data, origin)
    if not f.bool("rope_interleave", True):
        raise f.error("rope_interleave false (the rotated rows already in halves) is not supported")
    heads = f.int("num_attention_heads")
    if f.positive("num_key_value_heads", heads) != heads:
        raise f.error("num_key_value_heads other than num_attention_heads: MLA has a key and value per head")
    for name, allowed in (("scoring_func", ("sigmoid",)), ("topk_method", ("noaux_tc", "greedy", "group_limited_greedy"))):
        if name in f.data and f.data[name] not in allowed:
            raise f.error(f"{name} '{f.data[name]}' is not supported ({', '.join(allowed)})")
    nope, rope, q_lora = f.positive("qk_nope_head_dim", 128), f.positive("qk_rope_head_dim", 64), f.data.get("q_lora_rank")
    n = f.int("num_hidden_layers")
    dense = f.int("first_k_dense_replace", 3)
    shared = f.int("n_shared_experts", 1)
    groups = (f.positive("n_group", 8), f.positive("topk_group", 4))
    bias = f.bool("attention_bias", False)
    data = {**f.data, "head_dim": nope + rope}
    config = decoder_config_from_hf(
        ConfigFields(data, origin), "deepseek_v3", {"rms_norm_eps": 1e-6}, qkv_bias=bias, o_bias=bias,
        rope_dim=rope, n_experts=f.positive("n_routed_experts", 256), n_experts_used=f.positive("num_experts_per_tok", 8),
        moe_d_ff=f.positive("moe_intermediate_size", 2048), norm_topk_prob=f.bool("norm_topk_prob", True),
        moe_layers=tuple(i >= dense for i in range(n)), shared_expert_d_ff=shared * f.positive("moe_intermediate_size", 2048),
        shared_expert_gate=False, router_scoring="sigmoid", expert_groups=groups,
        routed_scaling=f.float("routed_scaling_factor", 2.5), router_correction_bias=True,
        mla=MLAShape(kv_lora_rank=f.positive("kv_lora_rank", 512), qk_nope_dim=nope, qk_rope_dim=rope,
                     v_head_dim=f.positive("v_head_dim", 128), q_lora_rank=0 if q_lora is None else int(q_lora),
                     scale=1.0))
    p = rope_parameters(f)
    m_all = p.float("mscale_all_dim", 0.0) if config.rope_scaling is not None else 0.0
    return replace(config, mla=replace(config.mla, scale=mla_scale(nope + rope, config.rope_scaling, m_all)))


def config_to_hf(c: LlamaConfig) -> dict[str, Any]:
    _check(c, "HF's deepseek_v3")
    out = decoder_config_to_hf(c, "deepseek_v3", "DeepseekV3ForCausalLM", biases=(c.qkv_bias, c.o_bias, False),
                               experts=True, has=_HAS)
    m = c.mla
    dense = next((i for i in range(c.n_layers) if c.experts_at(i)), c.n_layers)
    out["rope_parameters"].pop("partial_rotary_factor", None)
    s = c.rope_scaling
    if s is not None and s.kind == "yarn":  # DeepSeek's mscale: the attention scale's, read back from it
        m_all = _mscale_all_dim(c)
        out["rope_parameters"].update(mscale=m_all, mscale_all_dim=m_all)
        out["rope_parameters"].pop("attention_factor", None)
    out.update(head_dim=m.qk_rope_dim, qk_nope_head_dim=m.qk_nope_dim, qk_rope_head_dim=m.qk_rope_dim,
               v_head_dim=m.v_head_dim, kv_lora_rank=m.kv_lora_rank, q_lora_rank=m.q_lora_rank or None,
               n_routed_experts=c.n_experts, num_experts_per_tok=c.n_experts_used,
               moe_intermediate_size=c.moe_d_ff, n_shared_experts=c.shared_expert_d_ff // c.moe_d_ff,
               first_k_dense_replace=dense, n_group=c.expert_groups[0], topk_group=c.expert_groups[1],
               routed_scaling_factor=c.routed_scaling, norm_topk_prob=c.norm_topk_prob, rope_interleave=True,
               scoring_func="sigmoid", topk_method="noaux_tc", num_mtp_layers=0)
    return out


def _mscale_all_dim(c: LlamaConfig) -> float:
    """mscale_all_dim from the attention scale (it is (0.1 · m · ln factor + 1)² × head^-½)."""
    ratio = c.mla.scale / c.mla.qk_head_dim ** -0.5
    return (math.sqrt(ratio) - 1.0) / (0.1 * math.log(c.rope_scaling.factor)) if c.rope_scaling.factor > 1 else 0.0


def _check(c: LlamaConfig, where_to: str) -> None:
    """What DeepSeek-V3's layer always is: latent attention, sigmoid routing with its bias, dense layers first
    then experts, the shared experts ungated and a whole number of the expert size."""
    dense = [not c.experts_at(i) for i in range(c.n_layers)]
    problems = [what for what, bad in (
        ("attention other than latent attention", c.mla is None),
        ("routing other than DeepSeek's sigmoid", c.router_scoring != "sigmoid" or not c.router_correction_bias),
        ("dense layers after the first expert layer", dense != sorted(dense, reverse=True)),
        ("a gated shared expert", bool(c.shared_expert_d_ff) and c.shared_expert_gate),
        ("shared experts that are not a whole number of experts", bool(c.moe_d_ff) and c.shared_expert_d_ff % c.moe_d_ff),
        ("a window", c.sliding_window is not None)) if bad]
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


def hf_keymap(c: LlamaConfig) -> KeyMap:
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
    return decoder_hf_keymap(c, "deepseek_v3", NORMS + attention + MLP + EXPERT_ROWS + shared,
                             rows + fused_experts(c))


# llama.cpp's k_b: (heads, r, nope) per head transposed; v_b: (heads, v, r)
_K_B = Transform("k_b_by_head_transposed",
                 lambda t, c: t.transpose(1, 2).reshape(-1, t.shape[1]),
                 lambda t, c: t.view(c.n_heads, -1, t.shape[1]).transpose(1, 2).contiguous(),
                 lambda s, c: (s[0] * s[2], s[1]) if len(s) == 3 else (-1,))
_V_B = Transform("v_b_by_head", lambda t, c: t.reshape(-1, t.shape[2]),
                 lambda t, c: t.view(c.n_heads, -1, t.shape[1]),
                 lambda s, c: (s[0] * s[1], s[2]) if len(s) == 3 else (-1,))


def gguf_keymap(c: LlamaConfig) -> KeyMap:
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
    return KeyMap("deepseek2 (GGUF)", [Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"), *layer,
                                        Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight"), head])


def config_from_gguf(f: Any, tensors: dict) -> LlamaConfig:
    """llama.cpp's deepseek2: the MLA sizes from its own keys, sigmoid routing (expert_gating_func), the
    dense layers first, DeepSeek's YaRN mscale from yarn_log_mul."""
    if f.get(Keys.LLM.EXPERT_GATING_FUNC, int, 0) != ExpertGatingFuncType.SIGMOID:
        raise where(f.path, "deepseek2 routing other than sigmoid (expert_gating_func) is not supported")
    n = f.get(Keys.LLM.BLOCK_COUNT, int)
    k_len, v_len = f.get(Keys.Attention.KEY_LENGTH_MLA, int), f.get(Keys.Attention.VALUE_LENGTH_MLA, int)
    rope = f.get(Keys.Rope.DIMENSION_COUNT, int)
    heads = f.get(Keys.Attention.HEAD_COUNT, int)
    dense = f.get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, int, 0)
    moe_d_ff = f.get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int)
    config = decoder_config_from_gguf(
        f, tensors, "deepseek_v3", partial_rotary=True, head_dim=k_len, yarn_log_mul=True, n_kv_heads=heads,
        n_experts=f.get(Keys.LLM.EXPERT_COUNT, int), n_experts_used=f.get(Keys.LLM.EXPERT_USED_COUNT, int),
        moe_d_ff=moe_d_ff, moe_layers=tuple(i >= dense for i in range(n)),
        shared_expert_d_ff=f.get(Keys.LLM.EXPERT_SHARED_COUNT, int) * moe_d_ff, shared_expert_gate=False,
        router_scoring="sigmoid", norm_topk_prob=f.get(Keys.LLM.EXPERT_WEIGHTS_NORM, bool, False),
        expert_groups=(f.get(Keys.LLM.EXPERT_GROUP_COUNT, int, 1), f.get(Keys.LLM.EXPERT_GROUP_USED_COUNT, int, 1)),
        routed_scaling=f.get(Keys.LLM.EXPERT_WEIGHTS_SCALE, float, 1.0), router_correction_bias=True,
        mla=MLAShape(kv_lora_rank=f.get(Keys.Attention.KV_LORA_RANK, int), qk_nope_dim=k_len - rope,
                     qk_rope_dim=rope, v_head_dim=v_len, q_lora_rank=f.get(Keys.Attention.Q_LORA_RANK, int, 0),
                     scale=1.0))
    m_all = f.get(Keys.Rope.SCALING_YARN_LOG_MUL, float, 0.0) / 0.1
    return replace(config, mla=replace(config.mla, scale=mla_scale(k_len, config.rope_scaling, m_all)))


def gguf_metadata(w: Any, c: LlamaConfig) -> None:
    """llama.cpp's converter: the generic keys (K/V heads 1: its MLA is MQA over the latent), then its MLA
    and expert keys, DeepSeek's YaRN."""
    try:
        _check(c, "llama.cpp's deepseek2")
    except ValueError as e:
        raise GptconvError(f"{e}; not exported") from None
    m = c.mla
    dense = next((i for i in range(c.n_layers) if c.experts_at(i)), c.n_layers)
    add_decoder_hparams(w, c, has=_HAS, arch="deepseek2", kv_heads=1)
    s = c.rope_scaling
    if s is not None and s.kind == "yarn":
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(s.factor)
        w.add_rope_scaling_orig_ctx_len(s.original_context_length)
        w.add_rope_scaling_yarn_beta_fast(s.beta_fast)
        w.add_rope_scaling_yarn_beta_slow(s.beta_slow)
    if c.n_experts:
        w.add_expert_group_count(c.expert_groups[0])
        w.add_expert_group_used_count(c.expert_groups[1])
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
    w.add_expert_feed_forward_length(c.moe_d_ff)
    w.add_expert_count(c.n_experts)
    w.add_expert_shared_count(c.shared_expert_d_ff // c.moe_d_ff)
    w.add_expert_weights_scale(c.routed_scaling)
    if c.norm_topk_prob:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(m.qk_rope_dim)
    if s is not None and s.kind == "yarn":
        w.add_rope_scaling_yarn_log_mul(0.1 * _mscale_all_dim(c))


FAMILY = Family(
    name="deepseek_v3", config_class=LlamaConfig, model_class=Llama, presets=PRESETS,
    hf_model_types=("deepseek_v3",), config_from_hf=config_from_hf, config_to_hf=config_to_hf, hf_keymap=hf_keymap,
    gguf_arch="deepseek2", config_from_gguf=config_from_gguf, gguf_keymap=gguf_keymap, gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
)
