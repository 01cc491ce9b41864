"""Gemma 3, text only (HF gemma3_text; GGUF gemma3): Gemma's trace (``layers/gemma.py``) with q and k
RMS-normed per head before RoPE (as Qwen3) and no soft-capping. Layers are local (sliding window, RoPE
base 10k) or global (every position, RoPE base 1M, linear scaling on the 4B and larger), five local to
one global in the released models.

Formats: HF stores each norm weight as w, the model scaling by 1 + w; llama.cpp's converter stores
1 + w (llama.cpp's norms scale by their weight), so every norm crosses the GGUF table through
NORM_PLUS_ONE. Q and K rows are not permuted: llama.cpp's gemma3 rotates halves (NEOX RoPE), as HF does.
"""

from __future__ import annotations

import math
from typing import Any

from gguf import Keys, RopeScalingType

from ..convert.gguf_meta import T, gguf_config, gguf_name
from ..convert.hf_config import ConfigFields, build_config
from ..convert.hf_decoder import rope_from_hf
from ..convert.keymap import KeyMap, Map, TensorInfo, Tied, Transform
from ..errors import GptconvError, where
from ..layers.gemma import FULL, SLIDING, Gemma, GemmaConfig, default_layer_types
from ..layers.rope import RopeScaling
from .base import Family, Preset, Wrapper

# The published configs (config.json of each google/gemma-3-*-pt repository; 4b: its text_config)
PRESETS: dict[str, Preset] = {
    "gemma-3-270m": Preset(GemmaConfig(
        vocab_size=262144, context_length=32768, d_model=640, n_layers=18, n_heads=4, n_kv_heads=1, d_ff=2048,
        head_dim=256, sliding_window=512, layer_types=default_layer_types(18), query_pre_attn_scalar=256.0,
        rope_theta=1_000_000.0, rope_local_theta=10_000.0, bos_token_id=2, eos_token_id=1), "google/gemma-3-270m"),
    "gemma-3-1b": Preset(GemmaConfig(
        vocab_size=262144, context_length=32768, d_model=1152, n_layers=26, n_heads=4, n_kv_heads=1, d_ff=6912,
        head_dim=256, sliding_window=512, layer_types=default_layer_types(26), query_pre_attn_scalar=256.0,
        rope_theta=1_000_000.0, rope_local_theta=10_000.0, bos_token_id=2, eos_token_id=1), "google/gemma-3-1b-pt"),
    # the 4B's repo holds the multimodal model (model_type gemma3: text and vision); the preset is its text model
    "gemma-3-4b": Preset(GemmaConfig(
        vocab_size=262208, context_length=131072, d_model=2560, n_layers=34, n_heads=8, n_kv_heads=4, d_ff=10240,
        head_dim=256, sliding_window=1024, layer_types=default_layer_types(34), query_pre_attn_scalar=256.0,
        rope_theta=1_000_000.0, rope_scaling=RopeScaling("linear", factor=8.0), rope_local_theta=10_000.0,
        bos_token_id=2, eos_token_id=1), "google/gemma-3-4b-pt"),
}


GELU_TANH = "gelu_pytorch_tanh"


def gemma3_config_from_hf(data: dict[str, Any], origin: object) -> GemmaConfig:
    f = ConfigFields(data, origin)
    act = f.str("hidden_activation", None) or f.str("hidden_act", GELU_TANH)
    if act != GELU_TANH:
        raise f.error(f"hidden_activation '{act}' is not supported (Gemma's GeGLU uses {GELU_TANH})")
    if f.float("attn_logit_softcapping", None) is not None:
        raise f.error("attn_logit_softcapping (Gemma 2's tanh cap on attention scores) is not supported")
    f.refuse("use_bidirectional_attention", True, "bidirectional attention")
    f.refuse("attention_bias", True, "biases on q, k, v and the output")
    f.refuse("tie_word_embeddings", False, "an LM head untied from the embedding")
    n_layers = f.int("num_hidden_layers")
    if n_layers <= 0:  # said before layer_types, which are counted by it
        raise f.error(f"field 'num_hidden_layers' is {n_layers}; it must be at least 1")
    layer_types = _layer_types(f, n_layers)
    if "sliding_window" in data and data["sliding_window"] is None and SLIDING in layer_types:
        raise f.error("'sliding_window' is null but some layers are sliding_attention (no window is not supported)")
    (theta, scaling), local_theta = _rope(f)
    return build_config(
        GemmaConfig, f,
        **f.common(context_length="max_position_embeddings", d_model="hidden_size", n_layers="num_hidden_layers",
                   n_heads="num_attention_heads"),
        # absent fields take Gemma3TextConfig's defaults, as transformers would
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
        final_logit_softcapping=f.float("final_logit_softcapping", None),
        attention_dropout=f.float("attention_dropout", 0.0),
    )


def _rope(f: ConfigFields) -> tuple[tuple[float, RopeScaling | None], float]:
    """((global theta, global scaling), local theta). transformers 5 keys ``rope_parameters`` by layer
    type; older configs say ``rope_theta`` / ``rope_scaling`` (global) and ``rope_local_base_freq``."""
    params = f.dict("rope_parameters", None)
    if params is not None and (FULL in params or SLIDING in params):
        full, local = params.get(FULL) or {}, params.get(SLIDING) or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise f.error("rope_parameters: each layer type's entry must be an object")
    else:  # one set for the global layers (or the legacy fields)
        full = dict(params or f.dict("rope_scaling", None) or {})
        full.setdefault("rope_theta", f.float("rope_theta", 1_000_000.0))
        local = {"rope_theta": f.float("rope_local_base_freq", 10_000.0)}
    full.setdefault("rope_theta", 1_000_000.0)
    local.setdefault("rope_theta", 10_000.0)
    kind = full.get("rope_type", full.get("type", "default"))
    if kind not in ("default", "linear"):  # (Gemma's model does not rescale cos and sin, as YaRN needs)
        raise f.error(f"rope_type '{kind}' is not supported for Gemma (default, linear)")
    global_rope = rope_from_hf(ConfigFields({"rope_parameters": full}, f"{f.origin} (full_attention)"))
    local_theta, local_scaling = rope_from_hf(ConfigFields({"rope_parameters": local}, f"{f.origin} (sliding_attention)"))
    if local_scaling is not None:
        raise f.error("RoPE scaling on the sliding-window layers is not supported")
    return global_rope, local_theta


def _layer_types(f: ConfigFields, n_layers: int) -> tuple[str, ...]:
    types = f.data.get("layer_types")
    if types is None:  # older configs: every sliding_window_pattern-th layer global
        pattern = f.data.get("sliding_window_pattern", f.data.get("_sliding_window_pattern", 6))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise f.error(f"field 'sliding_window_pattern' is {pattern!r}, expected a positive integer")
        return default_layer_types(n_layers, pattern)
    if not isinstance(types, list) or len(types) != n_layers or any(t not in (SLIDING, FULL) for t in types):
        raise f.error(f"field 'layer_types' must list '{SLIDING}' or '{FULL}' for each of the {n_layers} layers")
    return tuple(types)


def gemma3_config_to_hf(c: GemmaConfig) -> dict[str, Any]:
    """The config.json transformers needs to build Gemma3ForCausalLM (model_type gemma3_text) for ``c``."""
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling is not None:
        if c.rope_scaling.kind != "linear":
            raise ValueError(f"HF's gemma3_text has no place for {c.rope_scaling.kind} RoPE scaling")
        full.update(rope_type="linear", factor=c.rope_scaling.factor)
    scalar = c.query_pre_attn_scalar
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.d_ff, "head_dim": c.head_dim, "rms_norm_eps": c.norm_eps,
        "hidden_activation": GELU_TANH,
        "query_pre_attn_scalar": int(scalar) if scalar == int(scalar) else scalar,  # an int in HF's own configs
        "sliding_window": c.sliding_window, "layer_types": list(c.layer_types),
        "rope_parameters": {FULL: full, SLIDING: {"rope_type": "default", "rope_theta": c.rope_local_theta}},
        "final_logit_softcapping": c.final_logit_softcapping, "attn_logit_softcapping": None,
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

GEMMA3_HF = KeyMap("gemma3_text (Hugging Face)", [
    Map("model.embed_tokens.weight", "tok_emb.weight"),
    *(Map(f"model.layers.{{i}}.{src}.weight", f"blocks.{{i}}.{dst}.weight") for src, dst in _LAYER),
    Map("model.norm.weight", "norm_f.weight"),
    Tied("lm_head.weight", "tok_emb.weight"),  # Gemma's head is the embedding; some files store it again
])


# ---------------------------------------------------------------------------------------------------
# GGUF (llama.cpp)

# llama.cpp's converter writes every Gemma norm weight w as 1 + w. Exact both ways for a weight whose
# 1 + w is a float32 (every bfloat16 weight of the released checkpoints); a float32 weight with more
# bits than 1 + w can hold loses them at export, as in llama.cpp's converter.
NORM_PLUS_ONE = Transform("norm_plus_one", lambda t, c: t - 1.0, lambda t, c: t + 1.0)

_GGUF_LAYER = [  # (llama.cpp's tensor, ours under blocks.{i}, transform)
    (T.ATTN_NORM, "norm1", NORM_PLUS_ONE), (T.ATTN_POST_NORM, "post_attn_norm", NORM_PLUS_ONE),
    (T.FFN_PRE_NORM, "norm2", NORM_PLUS_ONE), (T.FFN_POST_NORM, "post_mlp_norm", NORM_PLUS_ONE),
    (T.ATTN_Q, "attn.q", None), (T.ATTN_K, "attn.k", None), (T.ATTN_V, "attn.v", None),
    (T.ATTN_OUT, "attn.o", None),
    (T.ATTN_Q_NORM, "attn.q_norm", NORM_PLUS_ONE), (T.ATTN_K_NORM, "attn.k_norm", NORM_PLUS_ONE),
    (T.FFN_GATE, "mlp.gate", None), (T.FFN_UP, "mlp.up", None), (T.FFN_DOWN, "mlp.down", None),
]

GEMMA3_GGUF = KeyMap("gemma3 (GGUF)", [
    Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
    *(Map(gguf_name(src), f"blocks.{{i}}.{dst}.weight", *([t] if t else [])) for src, dst, t in _GGUF_LAYER),
    Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight", NORM_PLUS_ONE),
    Tied(gguf_name(T.OUTPUT), "tok_emb.weight"),
])

LLAMA_CPP_SWA_PATTERN = 6  # llama.cpp's gemma3 makes every 6th layer global; no key in the file says so
LLAMA_CPP_LOCAL_THETA = 10_000.0  # llama.cpp's local RoPE base where the file has no rope.freq_base_swa


def llama_cpp_query_scalar(n_layers: int, d_model: int, n_heads: int, head_dim: int) -> float:
    """The query_pre_attn_scalar llama.cpp assumes for a gemma3 file (it stores none): d / heads for the
    27B (62 layers), head_dim for every other size (as in Google's gemma_pytorch configs)."""
    return d_model / n_heads if n_layers == 62 else float(head_dim)


def gemma3_config_from_gguf(f: Any, tensors: dict[str, TensorInfo]) -> GemmaConfig:
    heads = f.get(Keys.Attention.HEAD_COUNT, int)
    d = f.get(Keys.LLM.EMBEDDING_LENGTH, int)
    n_layers = f.get(Keys.LLM.BLOCK_COUNT, int)
    head_dim = f.get(Keys.Attention.KEY_LENGTH, int, d // max(heads, 1))
    if f.get(Keys.Attention.VALUE_LENGTH, int, head_dim) != head_dim:
        raise where(f.path, "keys and values of different lengths are not supported")
    if f.get(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, float, None) is not None:
        raise where(f.path, "attn_logit_softcapping (a tanh cap on attention scores) is not supported")
    if f.get(Keys.Attention.SLIDING_WINDOW_PATTERN, object, None) is not None:
        raise where(f.path, "a sliding_window_pattern key is not supported (llama.cpp's gemma3 makes every "
                            f"{LLAMA_CPP_SWA_PATTERN}th layer global)")
    window = f.get(Keys.Attention.SLIDING_WINDOW, int, 0)
    kind = f.get(Keys.Rope.SCALING_TYPE, str, "none")
    if kind not in ("none", "linear"):
        raise where(f.path, f"RoPE scaling '{kind}' is not supported (linear)")
    scale = f.get(Keys.Attention.SCALE, float, None)  # written by our export only where llama.cpp's guess is wrong
    scalar = llama_cpp_query_scalar(n_layers, d, heads, head_dim)
    if scale:  # stored as a float32 scale: HF's scalar is an integer in every released config
        scalar = round(scale**-2) if abs(scale**-2 - round(scale**-2)) < 1e-3 else scale**-2
    try:
        scaling = RopeScaling("linear", factor=f.get(Keys.Rope.SCALING_FACTOR, float)) if kind == "linear" else None
    except ValueError as e:
        raise where(f.path, str(e)) from None
    return gguf_config(
        GemmaConfig, f, tensors,
        n_kv_heads=f.get(Keys.Attention.HEAD_COUNT_KV, int, heads),
        d_ff=f.get(Keys.LLM.FEED_FORWARD_LENGTH, int),
        head_dim=head_dim,
        # no window: llama.cpp runs every layer global
        sliding_window=window or f.get(Keys.LLM.CONTEXT_LENGTH, int),
        layer_types=default_layer_types(n_layers, LLAMA_CPP_SWA_PATTERN) if window else (FULL,) * n_layers,
        query_pre_attn_scalar=scalar,
        norm_eps=f.get(Keys.Attention.LAYERNORM_RMS_EPS, float),
        rope_theta=f.get(Keys.Rope.FREQ_BASE, float, 10_000.0),
        rope_scaling=scaling,
        rope_local_theta=f.get(Keys.Rope.FREQ_BASE_SWA, float, LLAMA_CPP_LOCAL_THETA),
        final_logit_softcapping=f.get(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, float, None),
    )


def gguf_llama_cpp_mismatch(c: GemmaConfig) -> str | None:
    """Why llama.cpp's gemma3 cannot run ``c`` as it is, or None."""
    if c.layer_types != default_layer_types(c.n_layers, LLAMA_CPP_SWA_PATTERN):
        return f"llama.cpp's gemma3 makes every {LLAMA_CPP_SWA_PATTERN}th layer global; this model's layer_types differ"
    return None


def query_scale_to_write(c: GemmaConfig) -> float | None:
    """The attention scale to store (``attention.scale``) where llama.cpp would assume another one."""
    assumed = llama_cpp_query_scalar(c.n_layers, c.d_model, c.n_heads, c.head_dim)
    return None if math.isclose(assumed, c.query_pre_attn_scalar, rel_tol=1e-6) else c.query_pre_attn_scalar**-0.5


def gemma3_gguf_metadata(w: Any, cfg: GemmaConfig) -> None:
    """What llama.cpp's converter writes for Gemma 3 (its TextModel's keys, then Gemma3Model's): no
    vocab_size, no rope dimension; both RoPE bases; the window (llama.cpp places the global layers itself)."""
    if (problem := gguf_llama_cpp_mismatch(cfg)) is not None:
        raise GptconvError(f"cannot be written as GGUF gemma3: {problem}")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    if cfg.rope_scaling is not None:  # the global layers'; linear is the only kind Gemma 3 has
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope_scaling.factor)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_freq_base_swa(cfg.rope_local_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    if cfg.final_logit_softcapping is not None:
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_sliding_window(cfg.sliding_window)
    if (scale := query_scale_to_write(cfg)) is not None:
        # llama.cpp stores no query_pre_attn_scalar (it assumes head_dim, or d / heads for the 27B);
        # we keep a scalar it would not assume, so that reading the file back keeps it
        w.add_attention_scale(scale)


def describe(cfg: GemmaConfig) -> list[str]:
    local = sum(t == SLIDING for t in cfg.layer_types)
    scaling = f", {cfg.rope_scaling.kind} scaling" if cfg.rope_scaling else ""
    return [f"position: RoPE on q and k; {local} local layers see their last {cfg.sliding_window} positions "
            f"(theta = {cfg.rope_local_theta:g}), {cfg.n_layers - local} global layers see all "
            f"(theta = {cfg.rope_theta:g}{scaling}); token_embedding is × √d; norms before and after each sublayer"]


FAMILY = Family(
    name="gemma3", config_class=GemmaConfig, model_class=Gemma, presets=PRESETS,
    hf_model_types=("gemma3_text",), config_from_hf=gemma3_config_from_hf, config_to_hf=gemma3_config_to_hf,
    hf_keymap=lambda config: GEMMA3_HF,
    gguf_arch="gemma3", config_from_gguf=gemma3_config_from_gguf, gguf_keymap=lambda config: GEMMA3_GGUF,
    gguf_metadata=gemma3_gguf_metadata,
    # Gemma3TextScaledWordEmbedding's output is already × √d, as our token_embedding step is
    hf_steps={"token_embedding": "model.embed_tokens", "block.{i}.q_norm": "model.layers.{i}.self_attn.q_norm",
              "block.{i}.k_norm": "model.layers.{i}.self_attn.k_norm",
              "block.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
              "block.{i}.post_feedforward_norm": "model.layers.{i}.post_feedforward_layernorm",
              "block.{i}": "model.layers.{i}", "final_norm": "model.norm"},
    describe=describe,
    # llama.cpp's converter: a SentencePiece Gemma vocabulary gets no space prefix
    gguf_vocab={"add_space_prefix_spm": False},
    # Gemma 3 4B, 12B, 27B: the text model of the multimodal checkpoint (SigLIP vision tower, projector)
    wrappers=(Wrapper("gemma3", ("gemma3_text",), left_out=("vision_tower.", "multi_modal_projector.",
                                                             "model.vision_tower.", "model.multi_modal_projector.")),),
)
