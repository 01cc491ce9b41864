"""Gemma's layouts (``layers/gemma.py``) in Hugging Face's and llama.cpp's files, shared by Gemma 2 and
Gemma 3: config.json ⇄ GemmaConfig, the key tables, GGUF metadata ⇄ GemmaConfig. What a generation
differs by is its ``GemmaFormat``: the layer pattern, q/k norms, a RoPE of the local layers' own, the
soft-caps, and what llama.cpp's architecture assumes where its file says nothing.

Formats: HF stores each norm weight as w, the model scaling by 1 + w; llama.cpp's converter stores
1 + w (llama.cpp's norms scale by their weight), so every norm crosses the GGUF table through
NORM_PLUS_ONE. Q and K rows are not permuted: llama.cpp's Gemma architectures rotate halves (NEOX
RoPE), as HF does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gguf import Keys, RopeScalingType

from ..errors import GptconvError, where
from ..layers.gemma import FULL, SLIDING, GemmaConfig, default_layer_types
from ..layers.rope import RopeScaling
from .gguf_meta import T, block_count, gguf_config, gguf_name
from .hf_config import ConfigFields, build_config
from .hf_rope import rope_from_hf
from .gguf_decoder import NORM_PLUS_ONE
from .keymap import KeyMap, Map, TensorInfo, Tied

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

GELU_TANH = "gelu_pytorch_tanh"
LLAMA_CPP_SOFTCAPS = (50.0, 30.0)  # llama.cpp's (attention, final) caps where a file that caps says none
LLAMA_CPP_THETA = 10_000.0  # llama.cpp's RoPE base where a file has no rope.freq_base


@dataclass(frozen=True)
class GemmaFormat:
    """One Gemma generation's formats: its names, and what its files leave to defaults."""

    family: str  # gptconv's name (GemmaConfig.family)
    model_type: str  # HF's
    hf_class: str
    gguf_arch: str
    layer_pattern: int  # every layer_pattern-th layer global where a config lists no layer_types (HF and llama.cpp)
    qk_norm: bool  # q and k RMS-normed per head before RoPE
    local_rope: bool  # the local layers rotate with a base of their own (the global layers may scale linearly);
    # else one RoPE, unscaled, for every layer
    caps_scores: bool  # transformers' model caps attention scores by attn_logit_softcapping (Gemma 2); Gemma 3's
    # keeps the field and never uses it, so a config that sets it is refused
    softcaps: tuple[float | None, float | None]  # HF's (attention, final) caps where config.json lacks the field
    theta: float  # HF's RoPE base (the global layers') where config.json has none
    llama_cpp_27b_layers: int  # the layer count at which llama.cpp scales queries by (d / heads)^-½, not head_dim^-½
    llama_cpp_caps: bool  # llama.cpp's architecture caps attention scores and logits always (LLAMA_CPP_SOFTCAPS
    # where the file has no key); else it caps the logits only where the file says, and never the scores
    llama_cpp_window: int | None  # the window llama.cpp assumes where the file has none (None: every layer global)


# ---------------------------------------------------------------------------------------------------
# Hugging Face


def gemma_config_from_hf(fmt: GemmaFormat, data: dict[str, Any], origin: object) -> GemmaConfig:
    f = ConfigFields(data, origin)
    act = f.str("hidden_activation", None) or f.str("hidden_act", GELU_TANH)
    if act != GELU_TANH:
        raise f.error(f"hidden_activation '{act}' is not supported (Gemma's GeGLU uses {GELU_TANH})")
    if not fmt.caps_scores and f.float("attn_logit_softcapping", None) is not None:
        raise f.error("attn_logit_softcapping (Gemma 2's tanh cap on attention scores) is not supported")
    f.refuse("use_bidirectional_attention", True, "bidirectional attention")
    f.refuse("attention_bias", True, "biases on q, k, v and the output")
    f.refuse("tie_word_embeddings", False, "an LM head untied from the embedding")
    n_layers = f.int("num_hidden_layers")
    if n_layers <= 0:  # said before layer_types, which are counted by it
        raise f.error(f"field 'num_hidden_layers' is {n_layers}; it must be at least 1")
    layer_types = _layer_types(f, n_layers, fmt.layer_pattern)
    if "sliding_window" in data and data["sliding_window"] is None and SLIDING in layer_types:
        raise f.error("'sliding_window' is null but some layers are sliding_attention (no window is not supported)")
    (theta, scaling), local_theta = _rope(f, fmt)
    attn_cap, final_cap = fmt.softcaps
    return build_config(
        GemmaConfig, f,
        **f.common(context_length="max_position_embeddings", d_model="hidden_size", n_layers="num_hidden_layers",
                   n_heads="num_attention_heads"),
        # absent fields take transformers' defaults for the model_type, as transformers would
        n_kv_heads=f.positive("num_key_value_heads", 4),
        d_ff=f.int("intermediate_size"),
        head_dim=f.positive("head_dim", 256),
        sliding_window=f.positive("sliding_window", 4096),
        layer_types=layer_types,
        query_pre_attn_scalar=f.float("query_pre_attn_scalar", 256.0),
        norm_eps=f.float("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local_theta,
        final_logit_softcapping=f.float("final_logit_softcapping", None) if "final_logit_softcapping" in data
        else final_cap,
        attn_logit_softcapping=f.float("attn_logit_softcapping", None) if "attn_logit_softcapping" in data
        else attn_cap,
        qk_norm=fmt.qk_norm,
        attention_dropout=f.float("attention_dropout", 0.0),
        family=fmt.family,
    )


def _rope(f: ConfigFields, fmt: GemmaFormat) -> tuple[tuple[float, RopeScaling | None], float]:
    """((global theta, global scaling), local theta). transformers 5 keys Gemma 3's ``rope_parameters`` by
    layer type; older configs say ``rope_theta`` / ``rope_scaling`` (global) and ``rope_local_base_freq``.
    Gemma 2 has one RoPE for every layer."""
    params = f.dict("rope_parameters", None)
    keyed = params is not None and (FULL in params or SLIDING in params)
    if not fmt.local_rope:
        if keyed:
            raise f.error(f"rope_parameters keyed by layer type: {fmt.model_type} has one RoPE for every layer")
        theta, scaling = rope_from_hf(f, fmt.theta)
        if scaling is not None:  # transformers would scale every layer; our model scales the global ones only
            raise f.error(f"rope_type '{scaling.kind}' is not supported for {fmt.model_type} (default)")
        return (theta, None), theta
    if keyed:
        full, local = params.get(FULL) or {}, params.get(SLIDING) or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise f.error("rope_parameters: each layer type's entry must be an object")
    else:  # one set for the global layers (or the legacy fields)
        full = dict(params or f.dict("rope_scaling", None) or {})
        full.setdefault("rope_theta", f.float("rope_theta", fmt.theta))
        local = {"rope_theta": f.float("rope_local_base_freq", 10_000.0)}
    full.setdefault("rope_theta", fmt.theta)
    local.setdefault("rope_theta", 10_000.0)
    kind = full.get("rope_type", full.get("type", "default"))
    if kind not in ("default", "linear"):  # (Gemma's model does not rescale cos and sin, as YaRN needs)
        raise f.error(f"rope_type '{kind}' is not supported for Gemma (default, linear)")
    global_rope = rope_from_hf(ConfigFields({"rope_parameters": full}, f"{f.origin} (full_attention)"))
    local_theta, local_scaling = rope_from_hf(ConfigFields({"rope_parameters": local}, f"{f.origin} (sliding_attention)"))
    if local_scaling is not None:
        raise f.error("RoPE scaling on the sliding-window layers is not supported")
    return global_rope, local_theta


def _layer_types(f: ConfigFields, n_layers: int, pattern: int) -> tuple[str, ...]:
    types = f.data.get("layer_types")
    if types is None:  # older configs: every sliding_window_pattern-th layer global
        pattern = f.data.get("sliding_window_pattern", f.data.get("_sliding_window_pattern", pattern))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise f.error(f"field 'sliding_window_pattern' is {pattern!r}, expected a positive integer")
        return default_layer_types(n_layers, pattern)
    if not isinstance(types, list) or len(types) != n_layers or any(t not in (SLIDING, FULL) for t in types):
        raise f.error(f"field 'layer_types' must list '{SLIDING}' or '{FULL}' for each of the {n_layers} layers")
    return tuple(types)


def gemma_config_to_hf(fmt: GemmaFormat, c: GemmaConfig) -> dict[str, Any]:
    """The config.json transformers needs to build ``fmt.hf_class`` for ``c``; what the model_type has no
    place for is refused."""
    if c.qk_norm != fmt.qk_norm:
        raise ValueError(f"HF's {fmt.model_type} has {'' if fmt.qk_norm else 'no '}RMSNorm on q and k")
    if c.attn_logit_softcapping is not None and not fmt.caps_scores:
        raise ValueError(f"HF's {fmt.model_type} does not cap attention scores")
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling is not None:
        if c.rope_scaling.kind != "linear" or not fmt.local_rope:
            raise ValueError(f"HF's {fmt.model_type} has no place for {c.rope_scaling.kind} RoPE scaling")
        full.update(rope_type="linear", factor=c.rope_scaling.factor)
    if fmt.local_rope:
        rope = {FULL: full, SLIDING: {"rope_type": "default", "rope_theta": c.rope_local_theta}}
    elif c.rope_local_theta != c.rope_theta:
        raise ValueError(f"HF's {fmt.model_type} has one RoPE base for every layer")
    else:
        rope = full
    scalar = c.query_pre_attn_scalar
    return {
        "architectures": [fmt.hf_class], "model_type": fmt.model_type,
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.d_ff, "head_dim": c.head_dim, "rms_norm_eps": c.norm_eps,
        "hidden_activation": GELU_TANH,
        "query_pre_attn_scalar": int(scalar) if scalar == int(scalar) else scalar,  # an int in HF's own configs
        "sliding_window": c.sliding_window, "layer_types": list(c.layer_types),
        "rope_parameters": rope,
        "final_logit_softcapping": c.final_logit_softcapping, "attn_logit_softcapping": c.attn_logit_softcapping,
        "attention_bias": False, "tie_word_embeddings": True, "use_bidirectional_attention": False,
        "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id, "pad_token_id": None,
        "attention_dropout": c.attention_dropout,
    }


_LAYER = [  # (HF name under model.layers.{i}, ours under blocks.{i})
    ("input_layernorm", "norm1"), ("post_attention_layernorm", "post_attn_norm"),
    ("pre_feedforward_layernorm", "norm2"), ("post_feedforward_layernorm", "post_mlp_norm"),
    *((f"self_attn.{n}_proj", f"attn.{n}") for n in "qkvo"),
    ("self_attn.q_norm", "attn.q_norm"), ("self_attn.k_norm", "attn.k_norm"),
    *((f"mlp.{n}_proj", f"mlp.{n}") for n in ("gate", "up", "down")),
]


def gemma_hf_keymap(model_type: str) -> KeyMap:
    """HF's names (q/k norms where the model has them: rows the model lacks are reported if a file has them)."""
    return KeyMap(f"{model_type} (Hugging Face)", [
        Map("model.embed_tokens.weight", "tok_emb.weight"),
        *(Map(f"model.layers.{{i}}.{src}.weight", f"blocks.{{i}}.{dst}.weight") for src, dst in _LAYER),
        Map("model.norm.weight", "norm_f.weight"),
        Tied("lm_head.weight", "tok_emb.weight"),  # Gemma's head is the embedding; some files store it again
    ])


def gemma_hf_steps(fmt: GemmaFormat) -> dict[str, str]:
    """Our step → transformers' module whose output it is. Gemma's scaled embedding module's output is
    already × √d, as our token_embedding step is."""
    qk = ({"block.{i}.q_norm": "model.layers.{i}.self_attn.q_norm",
           "block.{i}.k_norm": "model.layers.{i}.self_attn.k_norm"} if fmt.qk_norm else {})
    return {"token_embedding": "model.embed_tokens", **qk,
            "block.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
            "block.{i}.post_feedforward_norm": "model.layers.{i}.post_feedforward_layernorm",
            "block.{i}": "model.layers.{i}", "final_norm": "model.norm"}


# ---------------------------------------------------------------------------------------------------
# GGUF (llama.cpp)


_GGUF_LAYER = [  # (llama.cpp's tensor, ours under blocks.{i}, transform)
    (T.ATTN_NORM, "norm1", NORM_PLUS_ONE), (T.ATTN_POST_NORM, "post_attn_norm", NORM_PLUS_ONE),
    (T.FFN_PRE_NORM, "norm2", NORM_PLUS_ONE), (T.FFN_POST_NORM, "post_mlp_norm", NORM_PLUS_ONE),
    (T.ATTN_Q, "attn.q", None), (T.ATTN_K, "attn.k", None), (T.ATTN_V, "attn.v", None),
    (T.ATTN_OUT, "attn.o", None),
    (T.ATTN_Q_NORM, "attn.q_norm", NORM_PLUS_ONE), (T.ATTN_K_NORM, "attn.k_norm", NORM_PLUS_ONE),
    (T.FFN_GATE, "mlp.gate", None), (T.FFN_UP, "mlp.up", None), (T.FFN_DOWN, "mlp.down", None),
]


def gemma_gguf_keymap(arch: str) -> KeyMap:
    return KeyMap(f"{arch} (GGUF)", [
        Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
        *(Map(gguf_name(src), f"blocks.{{i}}.{dst}.weight", *([t] if t else [])) for src, dst, t in _GGUF_LAYER),
        Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight", NORM_PLUS_ONE),
        Tied(gguf_name(T.OUTPUT), "tok_emb.weight"),
    ])


LLAMA_CPP_LOCAL_THETA = 10_000.0  # llama.cpp's gemma3 local RoPE base where the file has no rope.freq_base_swa


def llama_cpp_query_scalar(fmt: GemmaFormat, n_layers: int, d_model: int, n_heads: int, head_dim: int) -> float:
    """The query_pre_attn_scalar llama.cpp assumes for a file of ``fmt`` (it stores none): d / heads for the
    27B, head_dim for every other size (as in Google's gemma_pytorch configs)."""
    return d_model / n_heads if n_layers == fmt.llama_cpp_27b_layers else float(head_dim)


def gemma_config_from_gguf(fmt: GemmaFormat, f: GGUFFields, tensors: dict[str, TensorInfo]) -> GemmaConfig:
    heads = f.get(Keys.Attention.HEAD_COUNT, int)
    d = f.get(Keys.LLM.EMBEDDING_LENGTH, int)
    n_layers = block_count(f, tensors)
    head_dim = f.get(Keys.Attention.KEY_LENGTH, int, d // max(heads, 1))
    if f.get(Keys.Attention.VALUE_LENGTH, int, head_dim) != head_dim:
        raise where(f.path, "keys and values of different lengths are not supported")
    attn_cap, final_cap = LLAMA_CPP_SOFTCAPS if fmt.llama_cpp_caps else (None, None)
    if not fmt.llama_cpp_caps and f.get(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, float, None) is not None:
        raise where(f.path, "attn_logit_softcapping (a tanh cap on attention scores) is not supported")
    if f.get(Keys.Attention.SLIDING_WINDOW_PATTERN, object, None) is not None:
        raise where(f.path, f"a sliding_window_pattern key is not supported (llama.cpp's {fmt.gguf_arch} makes "
                            f"every {fmt.layer_pattern}th layer global)")
    window = f.get(Keys.Attention.SLIDING_WINDOW, int, 0) or fmt.llama_cpp_window
    kind = f.get(Keys.Rope.SCALING_TYPE, str, "none")
    if kind not in ("none", "linear") or (kind == "linear" and not fmt.local_rope):
        raise where(f.path, f"RoPE scaling '{kind}' is not supported" + (" (linear)" if fmt.local_rope else ""))
    scale = f.get(Keys.Attention.SCALE, float, None)  # written by our export only where llama.cpp's guess is wrong
    scalar = llama_cpp_query_scalar(fmt, n_layers, d, heads, head_dim)
    if scale:  # stored as a float32 scale: HF's scalar is an integer in every released config
        scalar = round(scale**-2) if abs(scale**-2 - round(scale**-2)) < 1e-3 else scale**-2
    try:
        scaling = RopeScaling("linear", factor=f.get(Keys.Rope.SCALING_FACTOR, float)) if kind == "linear" else None
    except ValueError as e:
        raise where(f.path, str(e)) from None
    theta = f.get(Keys.Rope.FREQ_BASE, float, LLAMA_CPP_THETA)
    return gguf_config(
        GemmaConfig, f, tensors,
        n_kv_heads=f.get(Keys.Attention.HEAD_COUNT_KV, int, heads),
        d_ff=f.get(Keys.LLM.FEED_FORWARD_LENGTH, int),
        head_dim=head_dim,
        # no window: llama.cpp runs every layer global
        sliding_window=window or f.get(Keys.LLM.CONTEXT_LENGTH, int),
        layer_types=default_layer_types(n_layers, fmt.layer_pattern) if window else (FULL,) * n_layers,
        query_pre_attn_scalar=scalar,
        norm_eps=f.get(Keys.Attention.LAYERNORM_RMS_EPS, float),
        rope_theta=theta,
        rope_scaling=scaling,
        # gemma3: its own local base (10k where the file has none); gemma2: the global base where none
        rope_local_theta=f.get(Keys.Rope.FREQ_BASE_SWA, float, LLAMA_CPP_LOCAL_THETA if fmt.local_rope else theta),
        final_logit_softcapping=f.get(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, float, final_cap),
        attn_logit_softcapping=f.get(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, float, attn_cap),
        qk_norm=fmt.qk_norm,
        family=fmt.family,
    )


def gguf_llama_cpp_mismatch(fmt: GemmaFormat, c: GemmaConfig) -> str | None:
    """Why llama.cpp's architecture cannot run ``c`` as it is, or None."""
    if c.layer_types != default_layer_types(c.n_layers, fmt.layer_pattern):
        return (f"llama.cpp's {fmt.gguf_arch} makes every {fmt.layer_pattern}th layer global; this model's "
                "layer_types differ")
    if c.qk_norm != fmt.qk_norm:
        return f"llama.cpp's {fmt.gguf_arch} has {'' if fmt.qk_norm else 'no '}q/k norms"
    caps = (c.attn_logit_softcapping, c.final_logit_softcapping)
    if fmt.llama_cpp_caps and None in caps:
        return f"llama.cpp's {fmt.gguf_arch} soft-caps attention scores and logits always; this model does not"
    if not fmt.llama_cpp_caps and c.attn_logit_softcapping is not None:
        return f"llama.cpp's {fmt.gguf_arch} has no soft-cap on attention scores (attn_logit_softcapping)"
    if not fmt.local_rope and c.rope_scaling is not None:
        return f"llama.cpp's {fmt.gguf_arch} scales RoPE on every layer; this model on its global layers only"
    return None


def query_scale_to_write(fmt: GemmaFormat, c: GemmaConfig) -> float | None:
    """The attention scale to store (``attention.scale``) where llama.cpp would assume another one."""
    assumed = llama_cpp_query_scalar(fmt, c.n_layers, c.d_model, c.n_heads, c.head_dim)
    return None if math.isclose(assumed, c.query_pre_attn_scalar, rel_tol=1e-6) else c.query_pre_attn_scalar**-0.5


def gemma_gguf_metadata(fmt: GemmaFormat, w: GGUFWriter, cfg: GemmaConfig) -> None:
    """What llama.cpp's converter writes (its TextModel's keys, then the Gemma model's): no vocab_size, no
    rope dimension; the window (llama.cpp places the global layers itself). Gemma 3: both RoPE bases, the
    final cap where there is one. Gemma 2: the two caps; no RoPE base (written here only where it is not
    llama.cpp's 10k, which its converter loses)."""
    if (problem := gguf_llama_cpp_mismatch(fmt, cfg)) is not None:
        raise GptconvError(f"cannot be written as GGUF {fmt.gguf_arch}: {problem}")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    if cfg.rope_scaling is not None:  # the global layers'; linear is the only kind Gemma 3 has
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope_scaling.factor)
    if fmt.local_rope or cfg.rope_theta != LLAMA_CPP_THETA:
        w.add_rope_freq_base(cfg.rope_theta)
    if fmt.local_rope or cfg.rope_local_theta != cfg.rope_theta:
        w.add_rope_freq_base_swa(cfg.rope_local_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    if cfg.attn_logit_softcapping is not None:
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
    if cfg.final_logit_softcapping is not None:
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_sliding_window(cfg.sliding_window)
    if (scale := query_scale_to_write(fmt, cfg)) is not None:
        # llama.cpp stores no query_pre_attn_scalar (it assumes head_dim, or d / heads for the 27B);
        # we keep a scalar it would not assume, so that reading the file back keeps it
        w.add_attention_scale(scale)


def describe_gemma(cfg: GemmaConfig) -> list[str]:
    local = sum(t == SLIDING for t in cfg.layer_types)
    scaling = f", {cfg.rope_scaling.kind} scaling" if cfg.rope_scaling else ""
    lines = [f"position: RoPE on q and k; {local} local layers see their last {cfg.sliding_window} positions "
             f"(theta = {cfg.rope_local_theta:g}), {cfg.n_layers - local} global layers see all "
             f"(theta = {cfg.rope_theta:g}{scaling}); token_embedding is × √d; norms before and after each sublayer"]
    caps = [f"{what} soft-capped: c · tanh(x / c), c = {cap:g}" for what, cap in (
        ("attention scores", cfg.attn_logit_softcapping), ("logits", cfg.final_logit_softcapping)) if cap is not None]
    return lines + (["also: " + "; ".join(caps)] if caps else [])
