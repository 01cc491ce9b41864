"""The Llama family (HF llama, mistral, qwen2; GGUF llama): config.json and GGUF metadata →
LlamaConfig, the key maps of both formats, and llama.cpp's Q/K row permutation."""

from __future__ import annotations

from typing import Any

import torch
from gguf import Keys

from ..errors import where
from ..models.llama import LlamaConfig
from ..models.rope import RopeScaling, llama3_from_factors
from .gguf_meta import T, gguf_config, gguf_name
from .hf_config import ConfigFields, build_config
from .keymap import Drop, Fuse, Fused, KeyMap, Map, Rule, Stacked, TensorInfo, Tied, Transform, concat


def rope_from_hf(f: ConfigFields, default_theta: float = 10000.0) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from transformers 5's ``rope_parameters`` or the legacy ``rope_theta`` / ``rope_scaling``.
    A ``rope_scaling`` beside ``rope_parameters`` wins, as it does in transformers."""
    params = dict(f.dict("rope_parameters", None) or {})
    legacy = f.dict("rope_scaling", None)
    if legacy or not params:  # legacy: theta at top level, scaling (if any) in rope_scaling with 'type' or 'rope_type'
        params = {"rope_theta": params.get("rope_theta", f.float("rope_theta", default_theta)), **(legacy or {})}
    if "partial_rotary_factor" in f.data:  # Phi-3's config may say it at top level
        params.setdefault("partial_rotary_factor", f.float("partial_rotary_factor"))
    p = ConfigFields(params, f"{f.origin} (rope parameters)")
    theta = p.float("rope_theta", default_theta)
    kind = p.str("rope_type", None) or p.str("type", None) or "default"
    if p.float("partial_rotary_factor", 1.0) != 1.0:
        raise p.error("partial_rotary_factor != 1 (RoPE on part of each head) is not supported")
    try:
        if kind == "default":
            return theta, None
        if kind == "linear":
            return theta, RopeScaling("linear", factor=p.float("factor"))
        if kind == "llama3":
            return theta, RopeScaling("llama3", factor=p.float("factor"), low_freq_factor=p.float("low_freq_factor"),
                                      high_freq_factor=p.float("high_freq_factor"),
                                      original_context_length=p.int("original_max_position_embeddings"))
    except ValueError as e:
        raise p.error(str(e)) from None
    raise p.error(f"rope_type '{kind}' is not supported (default, linear, llama3)")


# model_type → transformers' defaults for the fields a config.json may leave out, where they are not Llama's
# (rms_norm_eps 1e-6, rope_theta 1e4, no sliding window): a missing field means what transformers reads
LLAMA_FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": 4096},
    "mixtral": {"rms_norm_eps": 1e-5, "rope_theta": 1e6},
    "qwen2": {"max_window_layers": 28},
    "qwen3": {"max_window_layers": 28},
    "phi3": {"rms_norm_eps": 1e-5},
}


def llama_config_from_hf(data: dict[str, Any], origin: object) -> LlamaConfig:
    f = ConfigFields(data, origin)
    model_type = f.str("model_type")
    act = f.str("hidden_act", "silu")
    if act != "silu":
        raise f.error(f"hidden_act '{act}' is not supported (SwiGLU uses silu)")
    defaults = LLAMA_FAMILIES.get(model_type, {})
    theta, scaling = rope_from_hf(f, defaults.get("rope_theta", 10000.0))
    if model_type == "qwen2":  # Qwen2 always has q/k/v biases and none on the output
        qkv_bias, o_bias = True, False
    elif model_type in ("llama", "qwen3"):
        qkv_bias = o_bias = f.bool("attention_bias", False)
    else:  # Mistral, Mixtral and Phi-3 have no biases
        qkv_bias = o_bias = False
    for name in ("pretraining_tp",):
        if f.data.get(name, 1) not in (1, None):
            raise f.error(f"'{name}' = {f.data[name]!r} is not supported")
    experts = {}
    if model_type == "mixtral":
        experts = dict(n_experts=f.int("num_local_experts"), n_experts_used=f.int("num_experts_per_tok"))
    # dropouts and noise that act in training only, which our modules do not have
    untrained = tuple(f"{name} {f.data[name]}" for name in ("resid_pdrop", "embd_pdrop", "router_jitter_noise")
                      if f.float(name, 0.0))
    return build_config(
        LlamaConfig, f,
        **f.common(context_length="max_position_embeddings", d_model="hidden_size", n_layers="num_hidden_layers",
                   n_heads="num_attention_heads"),
        n_kv_heads=f.positive("num_key_value_heads", f.int("num_attention_heads")),
        d_ff=f.int("intermediate_size"),
        head_dim=f.positive("head_dim", 0),  # 0: d_model / n_heads
        norm_eps=f.float("rms_norm_eps", defaults.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=f.bool("tie_word_embeddings", False),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=f.bool("mlp_bias", False) if model_type == "llama" else False,  # only Llama has the option
        sliding_window=_sliding_window(f, model_type, defaults),
        qk_norm=model_type == "qwen3",
        attention_dropout=f.float("attention_dropout", 0.0),
        unsupported_in_training=untrained,
        family=model_type,
        **experts,
    )


def _sliding_window(f: ConfigFields, model_type: str, defaults: dict) -> int | None:
    """The window every layer attends within, or None. Mistral, Mixtral and Phi-3 window every layer
    when ``sliding_window`` is set; Qwen2/3 only with ``use_sliding_window``, and then only some layers
    (``layer_types``, else those from ``max_window_layers`` on), which we refuse unless it is all."""
    types = _layer_types(f)
    if model_type in ("mistral", "mixtral", "phi3"):  # absent: the family's default; null: none
        return f.positive("sliding_window", None) if "sliding_window" in f.data else defaults.get("sliding_window")
    if model_type not in ("qwen2", "qwen3") or not f.bool("use_sliding_window", False):
        if types is not None and "sliding_attention" in types:
            raise f.error("layer_types has sliding_attention layers, but use_sliding_window is false")
        return None
    n = f.int("num_hidden_layers")
    if types is not None:
        sliding = [t == "sliding_attention" for t in types]
    else:
        first = f.int("max_window_layers", defaults["max_window_layers"])
        sliding = [i >= first for i in range(n)]
    if not any(sliding):
        return None
    if not all(sliding):
        raise f.error("sliding-window attention on some layers only is not supported for this model_type")
    return f.positive("sliding_window", None)


def _layer_types(f: ConfigFields) -> list[str] | None:
    """``layer_types``, checked: one of full_attention / sliding_attention per layer, or absent."""
    types = f.data.get("layer_types")
    if types is None:
        return None
    n = f.int("num_hidden_layers")
    if not isinstance(types, list) or len(types) != n:
        raise f.error(f"layer_types must list one kind per layer ({n})")
    bad = next((t for t in types if t not in ("full_attention", "sliding_attention")), None)
    if bad is not None or not all(isinstance(t, str) for t in types):
        raise f.error(f"layer_types: {bad!r} is not full_attention or sliding_attention")
    return types


def llama_model_type(c: LlamaConfig) -> str:
    """The HF model_type that writes ``c``: the one it came from, or the one its features need."""
    if c.n_experts:
        return "mixtral"
    if c.qk_norm:
        return "qwen3"
    if c.family in ("qwen2", "phi3", "mistral"):
        return c.family
    if c.qkv_bias and not c.o_bias:
        return "qwen2"
    return "mistral" if c.sliding_window is not None else "llama"


def llama_config_to_hf(c: LlamaConfig) -> dict[str, Any]:
    """The config.json transformers needs to build ``c`` (as LlamaForCausalLM, Qwen2ForCausalLM, …)."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling is not None:
        s = c.rope_scaling
        if s.kind == "factors":  # a GGUF's rope_freqs: HF configs say it as the llama3 scaling that gives them
            s = llama3_from_factors(s.factors, c.head_dim, c.rope_theta)
        rope.update({"rope_type": s.kind, "factor": s.factor})
        if s.kind == "llama3":
            rope.update({"low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                         "original_max_position_embeddings": s.original_context_length})
    kind = llama_model_type(c)
    biases = {"llama": (c.qkv_bias, c.qkv_bias, c.mlp_bias), "qwen2": (True, False, False),
              "qwen3": (c.qkv_bias, c.qkv_bias, False)}.get(kind, (False, False, False))
    if (c.qkv_bias, c.o_bias, c.mlp_bias) != biases:
        raise ValueError(f"HF's {kind} has no place for these biases (q/k/v {c.qkv_bias}, output {c.o_bias}, "
                         f"MLP {c.mlp_bias})")
    if c.sliding_window is not None and kind in ("llama", "qwen2", "qwen3") :
        raise ValueError(f"HF's {kind} has no sliding window on every layer")
    out = {
        "architectures": [HF_CLASSES[kind]], "model_type": kind,
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.d_ff, "head_dim": c.head_dim, "rms_norm_eps": c.norm_eps, "hidden_act": "silu",
        "rope_parameters": rope, "tie_word_embeddings": c.tie_embeddings, "attention_bias": c.qkv_bias,
        "mlp_bias": c.mlp_bias, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
        "sliding_window": c.sliding_window, "pad_token_id": None, "attention_dropout": c.attention_dropout,
    }
    if kind == "mixtral":  # as transformers writes Mixtral's config: no head_dim unless it is not d / heads
        out.update(num_local_experts=c.n_experts, num_experts_per_tok=c.n_experts_used)
        if c.head_dim == c.d_model // c.n_heads:
            out["head_dim"] = None
    return out


HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
              "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM"}


_NORMS = [("input_layernorm.weight", "norm1.weight"), ("post_attention_layernorm.weight", "norm2.weight")]
_ATTENTION = [(f"self_attn.{n}_proj.{p}", f"attn.{n}.{p}") for n in "qkvo" for p in ("weight", "bias")]
_MLP = [(f"mlp.{n}_proj.{p}", f"mlp.{n}.{p}") for n in ("gate", "up", "down") for p in ("weight", "bias")]
_QK_NORM = [("self_attn.q_norm.weight", "attn.q_norm.weight"), ("self_attn.k_norm.weight", "attn.k_norm.weight")]
# Mixtral: the router and each expert's SwiGLU (w1 gate, w3 up, w2 down)
_MOE = [("block_sparse_moe.gate.weight", "mlp.router.weight"),
        ("block_sparse_moe.experts.{j}.w1.weight", "mlp.experts.{j}.gate.weight"),
        ("block_sparse_moe.experts.{j}.w3.weight", "mlp.experts.{j}.up.weight"),
        ("block_sparse_moe.experts.{j}.w2.weight", "mlp.experts.{j}.down.weight")]



def _experts_gate_up(config: LlamaConfig) -> Fuse:
    """transformers 5's Mixtral module holds every expert's gate and up rows as one (E, 2·d_ff, d) tensor:
    expert e's gate rows, then its up rows. Parts in the order [gate 0, up 0, gate 1, up 1, …]."""
    def shapes(s: tuple[int, ...], c: LlamaConfig) -> list[tuple[int, ...]]:
        if len(s) != 3 or s[1] != 2 * c.d_ff:
            return [s]  # cannot be split so: the ledger reports the shape
        return [(c.d_ff, s[2])] * (2 * s[0])
    return Fuse("experts_gate_up", lambda t, c: [p for e in t.unbind(0) for p in e.split(c.d_ff, 0)],
                lambda ts, c: torch.stack([torch.cat(ts[k:k + 2], 0) for k in range(0, len(ts), 2)]), shapes)


def _moe_fused(config: LlamaConfig) -> list[Rule]:
    """Mixtral as transformers 5's module holds it (and saves it with save_original_format=False): the
    router under mlp.gate, the experts as two 3-D tensors."""
    experts = range(config.n_experts)
    return [Map("model.layers.{i}.mlp.gate.weight", "blocks.{i}.mlp.router.weight"),
            Fused("model.layers.{i}.mlp.experts.gate_up_proj",
                  [f"blocks.{{i}}.mlp.experts.{j}.{w}.weight" for j in experts for w in ("gate", "up")],
                  _experts_gate_up(config)),
            Stacked("model.layers.{i}.mlp.experts.down_proj", "blocks.{i}.mlp.experts.{j}.down.weight",
                    lambda c: c.n_experts)]


# Phi-3 stores q, k, v as one qkv_proj and gate, up as one gate_up_proj (rows one after the other)
SPLIT_QKV = concat("split_qkv", lambda c: [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                                           c.n_kv_heads * c.head_dim])
SPLIT_GATE_UP = concat("split_gate_up", lambda c: [c.d_ff, c.d_ff])
_PHI3 = [Fused("model.layers.{i}.self_attn.qkv_proj.weight",
               [f"blocks.{{i}}.attn.{n}.weight" for n in "qkv"], SPLIT_QKV),
         Fused("model.layers.{i}.mlp.gate_up_proj.weight",
               ["blocks.{i}.mlp.gate.weight", "blocks.{i}.mlp.up.weight"], SPLIT_GATE_UP)]


def llama_hf_keymap(config: LlamaConfig, module: bool = False) -> KeyMap:
    """HF names need no transform: HF's q/k rows are already in rotate-half order. Bias rows that
    the config does not enable are absent from the model, and so reported if a file has them.

    Mixtral reads both of its layouts: the files' (an expert per tensor, what export writes) and
    transformers 5's module's (experts fused); ``module``: the module's first, so that the inverse
    (``state_dict(..., "hf")``) gives what ``MixtralForCausalLM.load_state_dict`` takes."""
    kind = llama_model_type(config)
    head = (Tied("lm_head.weight", "tok_emb.weight") if config.tie_embeddings
            else Map("lm_head.weight", "lm_head.weight"))
    layer = list(_NORMS)
    fused = []
    if kind == "phi3":
        layer += [("self_attn.o_proj.weight", "attn.o.weight"), ("mlp.down_proj.weight", "mlp.down.weight")]
        fused = _PHI3
    else:
        layer += _ATTENTION + (_MOE if kind == "mixtral" else _MLP) + (_QK_NORM if kind == "qwen3" else [])
    if kind == "mixtral":
        fused = _moe_fused(config)
    rows = [Map(f"model.layers.{{i}}.{src}", f"blocks.{{i}}.{dst}") for src, dst in layer]
    return KeyMap(f"{kind} (Hugging Face)", [
        Map("model.embed_tokens.weight", "tok_emb.weight"),
        *((fused + rows) if module else (rows + fused)),
        Map("model.norm.weight", "norm_f.weight"),
        head,
        Drop("model.layers.{i}.self_attn.rotary_emb.inv_freq"),  # older files saved RoPE's buffer
    ])


# ---------------------------------------------------------------------------------------------------
# GGUF (llama.cpp)

def llama_config_from_gguf(f: Any, tensors: dict[str, TensorInfo]) -> LlamaConfig:
    """Architectures ``llama`` (Llama, Mistral, Mixtral), ``qwen2``, ``qwen3`` and ``phi3``."""
    arch = f.arch
    heads = f.get(Keys.Attention.HEAD_COUNT, int)
    d = f.get(Keys.LLM.EMBEDDING_LENGTH, int)
    head_dim = f.get(Keys.Attention.KEY_LENGTH, int, 0) or d // max(heads, 1)
    rope_dim = f.get(Keys.Rope.DIMENSION_COUNT, int, head_dim)
    if rope_dim != head_dim:
        raise where(f.path, f"RoPE on {rope_dim} of {head_dim} head dimensions is not supported")
    try:
        scaling = _rope_scaling(f, tensors, head_dim)
    except ValueError as e:
        raise where(f.path, str(e)) from None
    has = lambda tensor: gguf_name(tensor, "bias").replace("{i}", "0") in tensors  # noqa: E731
    n_experts = f.get(Keys.LLM.EXPERT_COUNT, int, 0)
    if n_experts and arch != "llama":
        raise where(f.path, f"mixture-of-experts '{arch}' models are not supported")
    window = f.get(Keys.Attention.SLIDING_WINDOW, int, 0) or None  # phi3 writes 0 for none
    family = {"llama": "mixtral" if n_experts else "mistral" if window else "llama"}.get(arch, arch)
    fused_qkv = arch == "phi3"
    return gguf_config(
        LlamaConfig, f, tensors,
        n_kv_heads=f.get(Keys.Attention.HEAD_COUNT_KV, int, heads),
        d_ff=f.get(Keys.LLM.FEED_FORWARD_LENGTH, int),
        head_dim=head_dim,
        norm_eps=f.get(Keys.Attention.LAYERNORM_RMS_EPS, float),
        rope_theta=f.get(Keys.Rope.FREQ_BASE, float, 10000.0),
        rope_scaling=scaling,
        tie_embeddings=gguf_name(T.OUTPUT) not in tensors,
        # biases present in block 0
        qkv_bias=has(T.ATTN_QKV if fused_qkv else T.ATTN_Q), o_bias=has(T.ATTN_OUT), mlp_bias=has(T.FFN_UP),
        sliding_window=window,
        qk_norm=arch == "qwen3",
        n_experts=n_experts,
        n_experts_used=f.get(Keys.LLM.EXPERT_USED_COUNT, int, 0) if n_experts else 0,
        family=family,
    )


def _rope_scaling(f: Any, tensors: dict[str, TensorInfo], head_dim: int) -> RopeScaling | None:
    scaling = None
    kind = f.get(Keys.Rope.SCALING_TYPE, str, "none")
    if kind == "linear":
        scaling = RopeScaling("linear", factor=f.get(Keys.Rope.SCALING_FACTOR, float))
    elif kind not in ("none", ""):
        raise ValueError(f"RoPE scaling '{kind}' is not supported")
    if "rope_freqs.weight" in tensors:  # Llama 3.1 scaling, stored as one factor per frequency
        factors = tensors["rope_freqs.weight"].load().flatten().tolist()
        if len(factors) != head_dim // 2 or not all(0 < x < 1e6 for x in factors):
            raise ValueError(f"rope_freqs has {len(factors)} factors, expected {head_dim // 2} positive ones")
        scaling = RopeScaling("factors", factors=tuple(factors))
    return scaling


def _permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF rotate-half rows → llama.cpp's interleaved pairs (per head: [x₀, x_{hd/2}, x₁, …])."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# llama.cpp applies the permutation to Q with n_heads rows groups and to K with n_kv_heads.
PERMUTE_Q = Transform("permute_q", lambda t, c: _unpermute(t, c.n_heads), lambda t, c: _permute(t, c.n_heads))
PERMUTE_K = Transform("permute_k", lambda t, c: _unpermute(t, c.n_kv_heads), lambda t, c: _permute(t, c.n_kv_heads))

_LLAMA_GGUF_LAYER = [  # (llama.cpp's tensor, ours, transform), weight and bias of each but the norms
    (T.ATTN_Q, "attn.q", PERMUTE_Q), (T.ATTN_K, "attn.k", PERMUTE_K), (T.ATTN_V, "attn.v", None),
    (T.ATTN_OUT, "attn.o", None), (T.FFN_GATE, "mlp.gate", None), (T.FFN_UP, "mlp.up", None),
    (T.FFN_DOWN, "mlp.down", None),
]
_GGUF_MOE = [  # Mixtral: the router, and every expert of a layer stacked in one tensor per matrix
    Map(gguf_name(T.FFN_GATE_INP), "blocks.{i}.mlp.router.weight"),
    *(Stacked(gguf_name(src), f"blocks.{{i}}.mlp.experts.{{j}}.{dst}.weight", lambda c: c.n_experts)
      for src, dst in ((T.FFN_GATE_EXP, "gate"), (T.FFN_UP_EXP, "up"), (T.FFN_DOWN_EXP, "down"))),
]
_GGUF_QK_NORM = [Map(gguf_name(T.ATTN_Q_NORM), "blocks.{i}.attn.q_norm.weight"),
                 Map(gguf_name(T.ATTN_K_NORM), "blocks.{i}.attn.k_norm.weight")]
# Phi-3 in llama.cpp keeps HF's fusions: attn_qkv, and ffn_up holding gate then up
_GGUF_PHI3 = [Fused(gguf_name(T.ATTN_QKV), [f"blocks.{{i}}.attn.{n}.weight" for n in "qkv"], SPLIT_QKV),
              Fused(gguf_name(T.FFN_UP), ["blocks.{i}.mlp.gate.weight", "blocks.{i}.mlp.up.weight"], SPLIT_GATE_UP),
              Map(gguf_name(T.ATTN_OUT), "blocks.{i}.attn.o.weight"),
              Map(gguf_name(T.FFN_DOWN), "blocks.{i}.mlp.down.weight")]


def llama_gguf_keymap(config: LlamaConfig, arch: str = "llama") -> KeyMap:
    """llama.cpp's names. Its ``llama`` architecture rotates interleaved pairs, so Q and K rows are
    permuted (PERMUTE_Q / PERMUTE_K); ``qwen2``, ``qwen3`` and ``phi3`` rotate halves as HF does, so
    nothing is."""
    head = (Tied(gguf_name(T.OUTPUT), "tok_emb.weight") if config.tie_embeddings
            else Map(gguf_name(T.OUTPUT), "lm_head.weight"))
    permuted = arch == "llama"
    if arch == "phi3":
        layer = _GGUF_PHI3
    else:
        rows = [r for r in _LLAMA_GGUF_LAYER if not (config.n_experts and r[1].startswith("mlp."))]
        layer = [Map(gguf_name(src, p), f"blocks.{{i}}.{dst}.{p}", *([t] if t and permuted else []))
                 for src, dst, t in rows for p in ("weight", "bias")]
        layer += (_GGUF_MOE if config.n_experts else []) + (_GGUF_QK_NORM if config.qk_norm else [])
    return KeyMap(f"{arch} (GGUF)", [
        Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
        Map(gguf_name(T.ATTN_NORM), "blocks.{i}.norm1.weight"),
        Map(gguf_name(T.FFN_NORM), "blocks.{i}.norm2.weight"),
        *layer,
        Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight"),
        head,
        Drop(gguf_name(T.ROPE_FREQS)),  # read into the config (RopeScaling "factors"), not a parameter
    ])
