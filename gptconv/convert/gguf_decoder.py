"""llama.cpp's layout of the decoder (``layers/decoder.py``), shared by the families built on it:
the metadata every such architecture has, RoPE scaling (``rope_freqs``), the Q/K row permutation of
llama.cpp's ``llama`` architecture, the standard tensor rows and the hyperparameters its converter
writes. A family file passes what is its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from gguf import Keys, RopeScalingType

from ..errors import GptconvError, where
from ..layers.decoder import Feature, DecoderConfig, typed_features
from ..layers.mlp import Experts
from ..layers.rope import RopeScaling
from .gguf_meta import T, gguf_config, gguf_name
from .keymap import Drop, KeyMap, Map, Rule, Stacked, TensorInfo, Tied, Transform

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields


def decoder_config_from_gguf(f: GGUFFields, tensors: dict[str, TensorInfo], family: str, fused_qkv: bool = False,
                             partial_rotary: bool = False, n_kv_heads: int | None = None, *,
                             attention: dict[str, Any] | None = None, rope: dict[str, Any] | None = None,
                             norms: dict[str, Any] | None = None, mlp: dict[str, Any] | None = None,
                             window: int | None = None, **specific: Any) -> DecoderConfig:
    """A config from the metadata every architecture of the decoder has; biases are those present in
    block 0. The family's own: ``attention``, ``rope``, ``norms``, ``mlp``, fields of those parts beyond or
    instead of what every file says (q/k norms, NoPE layers, offset norms, LayerNorm and its eps, an ungated
    GELU MLP); ``window``: its sliding layers'; ``specific``: other
    fields of the config (layer types, experts); ``partial_rotary``: the architecture rotates the first
    rope.dimension_count dimensions of each head (else they must be all); ``n_kv_heads``: where the family
    reads them itself (a per-layer list: LFM2)."""
    rope = dict(rope or {})
    heads = f.get(Keys.Attention.HEAD_COUNT, int)
    d = f.get(Keys.LLM.EMBEDDING_LENGTH, int)
    head_dim = f.get(Keys.Attention.KEY_LENGTH, int, 0) or d // max(heads, 1)
    rope_dim = f.get(Keys.Rope.DIMENSION_COUNT, int, head_dim)
    if rope_dim != head_dim and not (partial_rotary and 0 < rope_dim < head_dim):
        raise where(f.path, f"RoPE on {rope_dim} of {head_dim} head dimensions is not supported")
    if partial_rotary:
        rope["dim"] = rope_dim
    head_dim = specific.pop("head_dim", head_dim)  # a family that knows it otherwise (MLA: key_length is not it)
    try:
        scaling = _rope_scaling(f, tensors, rope_dim, specific.pop("yarn_log_mul", False))
    except ValueError as e:
        raise where(f.path, str(e)) from None
    has = lambda tensor: gguf_name(tensor, "bias").replace("{i}", "0") in tensors  # noqa: E731
    return gguf_config(
        DecoderConfig.build, f, tensors,
        n_kv_heads=n_kv_heads or f.get(Keys.Attention.HEAD_COUNT_KV, int, heads),
        d_ff=specific.pop("d_ff", None) or f.get(Keys.LLM.FEED_FORWARD_LENGTH, int),  # a family may know it otherwise
        head_dim=head_dim,
        norms=norms if norms and "eps" in norms else {"eps": f.get(Keys.Attention.LAYERNORM_RMS_EPS, float),
                                                      **(norms or {})},
        rope={"theta": f.get(Keys.Rope.FREQ_BASE, float, 10000.0), "scaling": scaling, **rope},
        tie_embeddings=gguf_name(T.OUTPUT) not in tensors,
        attention={"qkv_bias": has(T.ATTN_QKV if fused_qkv else T.ATTN_Q), "o_bias": has(T.ATTN_OUT),
                   "window": window, **(attention or {})},
        mlp={"bias": has(T.FFN_UP), **(mlp or {})},
        family=family,
        **specific,
    )


def experts_of(f: GGUFFields, **fields: Any) -> dict[str, Experts]:
    """The routed experts a file declares (their count and how many a token uses, and the family's other
    ``fields`` of ``Experts``) as the config's ``experts``, or nothing."""
    n = f.get(Keys.LLM.EXPERT_COUNT, int, 0)
    return dict(experts=Experts(n, f.get(Keys.LLM.EXPERT_USED_COUNT, int, 0), **fields)) if n else {}


def refuse_experts(f: GGUFFields) -> None:
    if f.get(Keys.LLM.EXPERT_COUNT, int, 0):
        raise where(f.path, f"mixture-of-experts '{f.arch}' models are not supported")


def window_of(f: GGUFFields) -> int | None:
    return f.get(Keys.Attention.SLIDING_WINDOW, int, 0) or None  # 0: none


def _factors(tensors: dict[str, TensorInfo], name: str, n: int) -> tuple[float, ...]:
    """A tensor of per-frequency RoPE factors (config stored as a tensor): n positive numbers."""
    factors = tensors[name].load().flatten().tolist()
    if len(factors) != n or not all(0 < x < 1e6 for x in factors):
        raise ValueError(f"{name} has {len(factors)} factors, expected {n} positive ones")
    return tuple(factors)


def _rope_scaling(f: GGUFFields, tensors: dict[str, TensorInfo], rope_dim: int, log_mul: bool = False) -> RopeScaling | None:
    """``rope_dim``: the dimensions of each head RoPE rotates; ``log_mul``: see ``yarn_of``."""
    scaling = None
    kind = f.get(Keys.Rope.SCALING_TYPE, str, "none")
    if kind == "linear":
        scaling = RopeScaling("linear", factor=f.get(Keys.Rope.SCALING_FACTOR, float))
    elif kind == "yarn":
        scaling = yarn_of(f, log_mul)
    elif kind not in ("none", ""):
        raise ValueError(f"RoPE scaling '{kind}' is not supported")
    if "rope_freqs.weight" in tensors:  # Llama 3.1 scaling, stored as one factor per frequency
        scaling = RopeScaling("factors", factors=_factors(tensors, "rope_freqs.weight", rope_dim // 2))
    long, short = gguf_name(T.ROPE_FACTORS_LONG), gguf_name(T.ROPE_FACTORS_SHORT)
    if long in tensors or short in tensors:  # longrope (Phi-3 128k, Phi-4-mini): both factor sets as tensors
        if scaling is not None or long not in tensors or short not in tensors:
            raise ValueError("longrope needs both rope_factors_long and rope_factors_short, and no other scaling")
        original = f.get(Keys.Rope.SCALING_ORIG_CTX_LEN, int)
        scaling = RopeScaling("longrope", factor=f.get(Keys.LLM.CONTEXT_LENGTH, int) / original,
                              original_context_length=original, factors=_factors(tensors, short, rope_dim // 2),
                              long_factors=_factors(tensors, long, rope_dim // 2),
                              attention_factor=f.get(Keys.Rope.SCALING_ATTN_FACTOR, float, 1.0))
    return scaling


def yarn_of(f: GGUFFields, log_mul: bool = False) -> RopeScaling:
    """YaRN as llama.cpp runs a file: cos and sin × (0.1·ln factor + 1) × rope.scaling.attn_factor (it
    recomputes the attention factor, whatever yarn_attn_factor says). DeepSeek's yarn_log_mul (0.1 ×
    mscale_all_dim) only where the family reads it (``log_mul``: its attention scale holds it; llama.cpp's
    deepseek2 then scales cos and sin by 1, as transformers does for mscale = mscale_all_dim)."""
    import math
    if f.get(Keys.Rope.SCALING_YARN_LOG_MUL, float, 0.0) and not log_mul:
        raise ValueError("YaRN with yarn_log_mul (DeepSeek's mscale) is not supported")
    if f.get(Keys.Rope.SCALING_YARN_EXT_FACTOR, float, 1.0) != 1.0:
        raise ValueError("YaRN with an extrapolation factor other than 1 is not supported")
    factor = f.get(Keys.Rope.SCALING_FACTOR, float)
    default = 1.0 if factor <= 1 or f.get(Keys.Rope.SCALING_YARN_LOG_MUL, float, 0.0) else 0.1 * math.log(factor) + 1.0
    return RopeScaling("yarn", factor=factor, original_context_length=f.get(Keys.Rope.SCALING_ORIG_CTX_LEN, int),
                       attention_factor=default * f.get(Keys.Rope.SCALING_ATTN_FACTOR, float, 1.0),
                       beta_fast=f.get(Keys.Rope.SCALING_YARN_BETA_FAST, float, 32.0),
                       beta_slow=f.get(Keys.Rope.SCALING_YARN_BETA_SLOW, float, 1.0))


def add_yarn_scaling(w: GGUFWriter, cfg: DecoderConfig, rounds_ramp: bool = False, attn_factor: bool = True) -> None:
    """YaRN as llama.cpp's converter writes it (the attention factor too, which llama.cpp recomputes: a
    factor other than 0.1·ln factor + 1 is refused, since llama.cpp would not run it). llama.cpp rounds the
    ramp's edges out to whole dimensions: a config that does not is refused, unless ``rounds_ramp`` says the
    family's file is written so all the same (gpt-oss, by llama.cpp's converter). ``attn_factor``: the
    converter writes the attention factor (for gpt-oss, whose config gives none, it does not)."""
    import math
    s = cfg.rope.scaling
    if s is None or s.kind != "yarn":
        return
    if not math.isclose(s.attention_factor, 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0, rel_tol=1e-6):
        raise GptconvError(f"YaRN attention factor {s.attention_factor:g}: llama.cpp computes its own "
                           "(0.1·ln factor + 1); not exported")
    if not s.truncate and not rounds_ramp:
        raise GptconvError("YaRN without truncated correction dimensions: llama.cpp has no such key; not exported")
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(s.factor)
    w.add_rope_scaling_orig_ctx_len(s.original_context_length)
    if attn_factor:
        w.add_rope_scaling_yarn_attn_factor(s.attention_factor)
    w.add_rope_scaling_yarn_beta_fast(s.beta_fast)
    w.add_rope_scaling_yarn_beta_slow(s.beta_slow)


def _permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF rotate-half rows → llama.cpp's interleaved pairs (per head: [x₀, x_{hd/2}, x₁, …])."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# llama.cpp's llama architecture permutes Q with n_heads row groups and K with n_kv_heads.
PERMUTE_Q = Transform("permute_q", lambda t, c: _unpermute(t, c.n_heads), lambda t, c: _permute(t, c.n_heads))
PERMUTE_K = Transform("permute_k", lambda t, c: _unpermute(t, c.n_kv_heads), lambda t, c: _permute(t, c.n_kv_heads))

_LAYER = [  # (llama.cpp's tensor, ours, transform where permuted), weight and bias of each but the norms
    (T.ATTN_Q, "attn.q", PERMUTE_Q), (T.ATTN_K, "attn.k", PERMUTE_K), (T.ATTN_V, "attn.v", None),
    (T.ATTN_OUT, "attn.o", None), (T.FFN_GATE, "mlp.gate", None), (T.FFN_UP, "mlp.up", None),
    (T.FFN_DOWN, "mlp.down", None),
]
EXPERTS = [  # the router, and every expert of a layer stacked in one tensor per matrix
    Map(gguf_name(T.FFN_GATE_INP), "blocks.{i}.mlp.router.weight"),
    *(Stacked(gguf_name(src), f"blocks.{{i}}.mlp.experts.{{j}}.{dst}.weight", lambda c: c.experts.count)
      for src, dst in ((T.FFN_GATE_EXP, "gate"), (T.FFN_UP_EXP, "up"), (T.FFN_DOWN_EXP, "down"))),
]
QK_NORM = [Map(gguf_name(T.ATTN_Q_NORM), "blocks.{i}.attn.q_norm.weight"),
           Map(gguf_name(T.ATTN_K_NORM), "blocks.{i}.attn.k_norm.weight")]


def standard_layer(permuted: bool, mlp: bool = True) -> list[Rule]:
    """The attention (and, with ``mlp``, the MLP) rows of a layer; ``permuted``: Q and K rows in
    llama.cpp's interleaved order (its ``llama`` architecture), not HF's rotate-half."""
    rows = [r for r in _LAYER if mlp or not r[1].startswith("mlp.")]
    return [Map(gguf_name(src, p), f"blocks.{{i}}.{dst}.{p}", *([t] if t and permuted else []))
            for src, dst, t in rows for p in ("weight", "bias")]


# llama.cpp's converter writes a norm weight w that scales by 1 + w (Gemma's, the Qwen hybrids') as 1 + w. Exact
# both ways for a weight whose 1 + w is a float32 (every bfloat16 weight of the released checkpoints); a
# float32 weight with more bits than 1 + w can hold loses them at export, as in llama.cpp's converter.
NORM_PLUS_ONE = Transform("norm_plus_one", lambda t, c: t - 1.0, lambda t, c: t + 1.0)

POST_NORMS = [Map(gguf_name(T.ATTN_POST_NORM), "blocks.{i}.post_attn_norm.weight"),
              Map(gguf_name(T.FFN_POST_NORM), "blocks.{i}.post_mlp_norm.weight")]


def decoder_gguf_keymap(config: DecoderConfig, arch: str, layer: list[Rule], final_norm: T = T.OUTPUT_NORM,
                        norm2: T = T.FFN_NORM) -> KeyMap:
    """llama.cpp's names for the decoder: ``layer`` holds the rows of a block but its norms (those after
    the sublayers: ``POST_NORMS``, added where the config has them); ``final_norm``: the final norm's tensor;
    ``norm2``: the pre-MLP norm's (gpt-oss and glm4moe call it post_attention_norm, after HF's name)."""
    head = (Tied(gguf_name(T.OUTPUT), "tok_emb.weight") if config.tie_embeddings
            else Map(gguf_name(T.OUTPUT), "lm_head.weight"))
    pre = [Map(gguf_name(T.ATTN_NORM), "blocks.{i}.norm1.weight"),
           Map(gguf_name(norm2), "blocks.{i}.norm2.weight")] if config.norms.place != "post" else []
    return KeyMap(f"{arch} (GGUF)", [
        Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
        *pre,
        *(POST_NORMS if config.norms.place != "pre" else []),
        *layer,
        Map(gguf_name(final_norm), "norm_f.weight"),
        head,
        # read into the config (RopeScaling "factors", "longrope"), not parameters
        Drop(gguf_name(T.ROPE_FREQS)), Drop(gguf_name(T.ROPE_FACTORS_LONG)), Drop(gguf_name(T.ROPE_FACTORS_SHORT)),
    ])


def add_decoder_hparams(w: GGUFWriter, cfg: DecoderConfig, *, vocab_size: bool = False, rope_dims: bool = False,
                        original_context: bool = False, has: frozenset[Feature] = frozenset(), arch: str = "",
                        feed_forward: bool = True, kv_heads: int | list[int] | None = None) -> None:
    """The hyperparameters llama.cpp's converter writes for every architecture of the decoder, in its
    order (a family adds its own after them: window, key length, scaling), no more, so that the two files'
    metadata can be compared key by key. ``vocab_size``, ``rope_dims``, ``original_context``: keys only some
    architectures get; ``feed_forward``: the dense MLP's size, absent where a config has none. ``has``: the
    features (``DecoderConfig.features``) llama.cpp's ``arch`` runs, which the family writes; a config with
    another is refused. ``kv_heads``: K/V heads per layer, where the architecture writes a list (LFM2: 0 on
    its conv layers), or the one count it writes where that is not the model's (deepseek2: 1)."""
    missing = cfg.features() - typed_features(has) - {Feature.LAYER_TYPES}  # windows: add_window
    if missing:
        raise GptconvError(f"llama.cpp's {arch or 'architecture'} has no place for: {', '.join(sorted(missing))}; "
                           "not exported")
    w.add_context_length(cfg.context_length)
    if original_context:  # without longrope the original context is the context
        s = cfg.rope.scaling
        w.add_rope_scaling_orig_ctx_len(s.original_context_length if s is not None and s.kind == "longrope"
                                        else cfg.context_length)
    w.add_embedding_length(cfg.d_model)
    if feed_forward:
        w.add_feed_forward_length(cfg.d_ff)
    w.add_block_count(cfg.n_layers + cfg.mtp_layers)  # llama.cpp's MTP layers are blocks after the model's
    w.add_head_count(cfg.n_heads)
    if vocab_size:
        w.add_vocab_size(cfg.vocab_size)
    w.add_head_count_kv(cfg.n_kv_heads if kv_heads is None else kv_heads)
    w.add_layer_norm_rms_eps(cfg.norms.eps)
    if rope_dims:
        w.add_rope_dimension_count(cfg.rope.dim or cfg.head_dim)
    w.add_rope_freq_base(cfg.rope.theta)
    if cfg.experts:
        w.add_expert_count(cfg.experts.count)
        w.add_expert_used_count(cfg.experts.used)


def add_llama_hparams(w: GGUFWriter, cfg: DecoderConfig, key_length_always: bool) -> None:
    """What llama.cpp's converter writes for its ``llama`` architecture (Llama, Mistral, Mixtral): the
    vocabulary size and the rope dimension too, and the window kept (see ``add_window``)."""
    add_decoder_hparams(w, cfg, vocab_size=True, rope_dims=True)
    add_window(w, cfg, "llama", kept=True)
    add_key_length(w, cfg, always=key_length_always)
    add_linear_scaling(w, cfg)


def add_window(w: GGUFWriter, cfg: DecoderConfig, arch: str, kept: bool) -> None:
    """A window on every layer: ``kept`` where the architecture has none in llama.cpp but the key is written
    so that reading the file back keeps it (llama.cpp ignores it); else refused."""
    if cfg.attention.window is not None:
        if not kept:
            raise GptconvError(f"llama.cpp's {arch} has no sliding window; not exported")
        if cfg.layer_types:
            raise GptconvError(f"llama.cpp's {arch} has no sliding window on some layers only; not exported")
        w.add_sliding_window(cfg.attention.window)


def add_key_length(w: GGUFWriter, cfg: DecoderConfig, always: bool) -> None:
    """The key/value length where config.json has head_dim: ``always``, or where it is not d / heads."""
    if always or cfg.head_dim != cfg.d_model // cfg.n_heads:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)


def add_linear_scaling(w: GGUFWriter, cfg: DecoderConfig) -> None:
    if cfg.rope.scaling is not None and cfg.rope.scaling.kind == "linear":
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope.scaling.factor)
