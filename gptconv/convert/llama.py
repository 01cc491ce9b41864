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
from .keymap import Drop, KeyMap, Map, TensorInfo, Tied, Transform


def rope_from_hf(f: ConfigFields) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from transformers 5's ``rope_parameters`` or the legacy ``rope_theta`` / ``rope_scaling``."""
    params = f.dict("rope_parameters", None)
    if params is None:  # legacy: theta at top level, scaling (if any) in rope_scaling with 'type' or 'rope_type'
        params = dict(f.dict("rope_scaling", None) or {})
        params.setdefault("rope_theta", f.float("rope_theta", 10000.0))
    p = ConfigFields(params, f"{f.origin} (rope parameters)")
    theta = p.float("rope_theta", 10000.0)
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


def llama_config_from_hf(data: dict[str, Any], origin: object) -> LlamaConfig:
    f = ConfigFields(data, origin)
    model_type = f.str("model_type")
    act = f.str("hidden_act", "silu")
    if act != "silu":
        raise f.error(f"hidden_act '{act}' is not supported (SwiGLU uses silu)")
    theta, scaling = rope_from_hf(f)
    window = None
    if model_type == "mistral" or (model_type == "qwen2" and f.bool("use_sliding_window", False)):
        window = f.int("sliding_window", None)
    if model_type == "qwen2":  # Qwen2 always has q/k/v biases and none on the output
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = f.bool("attention_bias", False)
    for name in ("pretraining_tp",):
        if f.data.get(name, 1) not in (1, None):
            raise f.error(f"'{name}' = {f.data[name]!r} is not supported")
    return build_config(
        LlamaConfig, f,
        **f.common(context_length="max_position_embeddings", d_model="hidden_size", n_layers="num_hidden_layers",
                   n_heads="num_attention_heads"),
        n_kv_heads=f.positive("num_key_value_heads", f.int("num_attention_heads")),
        d_ff=f.int("intermediate_size"),
        head_dim=f.positive("head_dim", 0),  # 0: d_model / n_heads
        norm_eps=f.float("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=f.bool("tie_word_embeddings", False),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=f.bool("mlp_bias", False) if model_type == "llama" else False,  # only Llama has the option
        sliding_window=window,
    )


def llama_config_to_hf(c: LlamaConfig) -> dict[str, Any]:
    """The config.json transformers needs to build LlamaForCausalLM for ``c``."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling is not None:
        s = c.rope_scaling
        if s.kind == "factors":  # a GGUF's rope_freqs: HF configs say it as the llama3 scaling that gives them
            s = llama3_from_factors(s.factors, c.head_dim, c.rope_theta)
        rope.update({"rope_type": s.kind, "factor": s.factor})
        if s.kind == "llama3":
            rope.update({"low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                         "original_max_position_embeddings": s.original_context_length})
    qwen2 = c.qkv_bias and not c.o_bias  # Qwen2's layout: q/k/v biases, none on o or the MLP
    if c.qkv_bias != c.o_bias and not (qwen2 and not c.mlp_bias):
        raise ValueError("HF's Llama has one attention_bias for q, k, v and o")
    if c.sliding_window is not None:
        raise ValueError("sliding-window configs are not exported")
    kind = ("Qwen2ForCausalLM", "qwen2") if qwen2 else ("LlamaForCausalLM", "llama")
    return {
        "architectures": [kind[0]], "model_type": kind[1],
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.d_ff, "head_dim": c.head_dim, "rms_norm_eps": c.norm_eps, "hidden_act": "silu",
        "rope_parameters": rope, "tie_word_embeddings": c.tie_embeddings, "attention_bias": c.qkv_bias,
        "mlp_bias": c.mlp_bias, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
    }


_LAYER = [
    ("input_layernorm.weight", "norm1.weight"),
    ("self_attn.q_proj.weight", "attn.q.weight"),
    ("self_attn.k_proj.weight", "attn.k.weight"),
    ("self_attn.v_proj.weight", "attn.v.weight"),
    ("self_attn.o_proj.weight", "attn.o.weight"),
    ("self_attn.q_proj.bias", "attn.q.bias"),
    ("self_attn.k_proj.bias", "attn.k.bias"),
    ("self_attn.v_proj.bias", "attn.v.bias"),
    ("self_attn.o_proj.bias", "attn.o.bias"),
    ("post_attention_layernorm.weight", "norm2.weight"),
    ("mlp.gate_proj.weight", "mlp.gate.weight"),
    ("mlp.up_proj.weight", "mlp.up.weight"),
    ("mlp.down_proj.weight", "mlp.down.weight"),
    ("mlp.gate_proj.bias", "mlp.gate.bias"),
    ("mlp.up_proj.bias", "mlp.up.bias"),
    ("mlp.down_proj.bias", "mlp.down.bias"),
]


def llama_hf_keymap(config: LlamaConfig) -> KeyMap:
    """HF names need no transform: HF's q/k rows are already in rotate-half order. Bias rows that
    the config does not enable are absent from the model, and so reported if a file has them."""
    head = (Tied("lm_head.weight", "tok_emb.weight") if config.tie_embeddings
            else Map("lm_head.weight", "lm_head.weight"))
    return KeyMap("llama (Hugging Face)", [
        Map("model.embed_tokens.weight", "tok_emb.weight"),
        *(Map(f"model.layers.{{i}}.{src}", f"blocks.{{i}}.{dst}") for src, dst in _LAYER),
        Map("model.norm.weight", "norm_f.weight"),
        head,
        Drop("model.layers.{i}.self_attn.rotary_emb.inv_freq"),  # older files saved RoPE's buffer
    ])


# ---------------------------------------------------------------------------------------------------
# GGUF (llama.cpp)

def llama_config_from_gguf(f: Any, tensors: dict[str, TensorInfo]) -> LlamaConfig:
    if f.get(Keys.LLM.EXPERT_COUNT, int, 0):
        raise where(f.path, "mixture-of-experts models are not supported")
    if f.get(Keys.Attention.SLIDING_WINDOW, int, 0):
        raise where(f.path, "sliding-window attention is not supported")
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
    return gguf_config(
        LlamaConfig, f, tensors,
        n_kv_heads=f.get(Keys.Attention.HEAD_COUNT_KV, int, heads),
        d_ff=f.get(Keys.LLM.FEED_FORWARD_LENGTH, int),
        head_dim=head_dim,
        norm_eps=f.get(Keys.Attention.LAYERNORM_RMS_EPS, float),
        rope_theta=f.get(Keys.Rope.FREQ_BASE, float, 10000.0),
        rope_scaling=scaling,
        tie_embeddings=gguf_name(T.OUTPUT) not in tensors,
        qkv_bias=has(T.ATTN_Q), o_bias=has(T.ATTN_OUT), mlp_bias=has(T.FFN_UP),  # biases present in block 0
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


def llama_gguf_keymap(config: LlamaConfig, arch: str = "llama") -> KeyMap:
    """llama.cpp's names. Its ``llama`` architecture rotates interleaved pairs, so Q and K rows are
    permuted (PERMUTE_Q / PERMUTE_K); its ``qwen2`` rotates halves as HF does, so nothing is."""
    head = (Tied(gguf_name(T.OUTPUT), "tok_emb.weight") if config.tie_embeddings
            else Map(gguf_name(T.OUTPUT), "lm_head.weight"))
    permuted = arch == "llama"
    return KeyMap(f"{arch} (GGUF)", [
        Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
        Map(gguf_name(T.ATTN_NORM), "blocks.{i}.norm1.weight"),
        Map(gguf_name(T.FFN_NORM), "blocks.{i}.norm2.weight"),
        *(Map(gguf_name(src, p), f"blocks.{{i}}.{dst}.{p}", *([t] if t and permuted else []))
          for src, dst, t in _LLAMA_GGUF_LAYER for p in ("weight", "bias")),
        Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight"),
        head,
        Drop(gguf_name(T.ROPE_FREQS)),  # read into the config (RopeScaling "factors"), not a parameter
    ])
