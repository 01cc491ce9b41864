"""Hugging Face's config.json of the decoder (``layers/decoder.py``), both ways: the fields every such
model_type has, sliding windows and layer types, routed experts; a family file passes what is its own
(biases, a window rule, q/k norms, experts). RoPE's fields are ``hf_rope.py``'s, the weights' and steps'
names ``hf_keys.py``'s."""

from __future__ import annotations

from typing import Any

from ..layers.decoder import FULL, SLIDING, DecoderConfig, Feature, typed_features
from ..layers.mlp import Experts
from .hf_config import ConfigFields, build_config
from .hf_rope import rope_by_layer_type, rope_dim_from_hf, rope_to_hf


def decoder_config_from_hf(f: ConfigFields, family: str, defaults: dict[str, Any], *,
                           attention: dict[str, Any] | None = None, rope: dict[str, Any] | None = None,
                           norms: dict[str, Any] | None = None, mlp: dict[str, Any] | None = None,
                           window: int | None = None, partial_rotary: bool = False,
                           training_only: tuple[str, ...] = (), **specific: Any) -> DecoderConfig:
    """The fields every model_type of the decoder has; ``defaults``: transformers' values for the fields a
    config.json may leave out, where they are not Llama's (rms_norm_eps 1e-6, rope_theta 1e4). The family's
    own: ``attention``, ``rope``, ``norms``, ``mlp``, fields of those parts (``AttentionOptions``, ``Rotary``,
    ``Norms``, ``MLPOptions``) beyond or instead of what every config says (a family that gives the MLP's
    ``act`` reads hidden_act itself; else it must be SwiGLU's silu); ``window``: its sliding layers' (with
    ``layer_types``);
    ``partial_rotary``: it rotates part of each head where the config says so; ``training_only``: its own
    config fields that act in training only (a dropout), besides the ones every decoder may have;
    ``specific``: other fields of the config (experts, layer types, µP multipliers)."""
    act = f.str("hidden_act", "silu")
    if "act" not in (mlp or {}) and act != "silu":  # a family that reads its own activation says which
        raise f.error(f"hidden_act '{act}' is not supported (SwiGLU uses silu)")
    theta, scaling, local_theta = rope_by_layer_type(f, defaults.get("rope_theta", 10000.0), partial_rotary)
    rope = {"theta": theta, "scaling": scaling, "local_theta": local_theta, **(rope or {})}
    if partial_rotary:
        head_dim = f.positive("head_dim", 0) or f.int("hidden_size") // max(f.int("num_attention_heads"), 1)
        rope["dim"] = rope_dim_from_hf(f, head_dim)
    if f.data.get("pretraining_tp", 1) not in (1, None):
        raise f.error(f"'pretraining_tp' = {f.data['pretraining_tp']!r} is not supported")
    # dropouts and noise that act in training only, which our modules do not have
    untrained = tuple(f"{name} {f.data[name]}" for name in ("resid_pdrop", "embd_pdrop", "router_jitter_noise",
                                                             *training_only) if f.float(name, 0.0))
    # layer_types checked whatever the family makes of them; recurrent layers only where the family has them
    for kind, field in (("linear_attention", "linear_attention"), ("conv", "short_conv")):
        if kind in (layer_types(f) or ()) and field not in specific:
            raise f.error(f"layer_types has {kind} layers, which model_type {family} does not have")
    return build_config(
        DecoderConfig.build, f,
        **f.common(context_length="max_position_embeddings", d_model="hidden_size", n_layers="num_hidden_layers",
                   n_heads="num_attention_heads"),
        n_kv_heads=f.positive("num_key_value_heads", f.int("num_attention_heads")),
        d_ff=f.int("intermediate_size"),
        head_dim=f.positive("head_dim", 0),  # 0: d_model / n_heads
        norms=norms if norms and "eps" in norms else {"eps": f.float("rms_norm_eps", defaults.get("rms_norm_eps", 1e-6)),
                                                      **(norms or {})},
        rope=rope,
        tie_embeddings=f.bool("tie_word_embeddings", False),
        attention={"dropout": f.float("attention_dropout", 0.0), "window": window, **(attention or {})},
        mlp=mlp,
        unsupported_in_training=untrained,
        family=family,
        **specific,
    )


def no_window(f: ConfigFields) -> None:
    """A model_type without sliding windows: ``layer_types`` may not ask for one."""
    types = layer_types(f)
    if types is not None and "sliding_attention" in types:
        raise f.error("layer_types has sliding_attention layers, but use_sliding_window is false")


def window_on_every_layer(f: ConfigFields, default: int | None) -> int | None:
    """``sliding_window`` applied to every layer: absent, the family's default; null, none (``layer_types``
    is checked by ``decoder_config_from_hf``)."""
    return f.positive("sliding_window", None) if "sliding_window" in f.data else default


def window_where_enabled(f: ConfigFields, max_window_layers: int) -> dict[str, Any]:
    """The windows of a model_type that windows only with ``use_sliding_window`` (Qwen2, Qwen3), and then
    the layers ``layer_types`` says, else those from ``max_window_layers`` on: window, layer_types."""
    types = layer_types(f)
    if not f.bool("use_sliding_window", False):
        no_window(f)
        return dict(window=None)
    n = f.int("num_hidden_layers")
    if types is None:
        first = f.int("max_window_layers", max_window_layers)
        types = [SLIDING if i >= first else FULL for i in range(n)]
    return windows_of_layer_types(f, types)


def windows_of_layer_types(f: ConfigFields, types: list[str] | None) -> dict[str, Any]:
    """The window and layer_types for a config whose ``types`` (one per layer, or None: none slides)
    say which layers slide; the window is ``sliding_window``, which must be set where some layer slides."""
    if not types or SLIDING not in types:
        return dict(window=None)
    if f.data.get("sliding_window") is None:
        raise f.error("'sliding_window' is null or absent but some layers are sliding_attention")
    return dict(window=f.positive("sliding_window", None), layer_types=tuple(types))


def windows_to_hf(c: DecoderConfig) -> dict[str, Any]:
    """The window fields of a model_type that windows only with ``use_sliding_window`` and says which
    layers in ``layer_types`` (Qwen2, Qwen3): every layer's kind written out."""
    if c.attention.window is None:
        return {"use_sliding_window": False, "sliding_window": None}
    return {"use_sliding_window": True, "sliding_window": c.attention.window, "max_window_layers": 0,
            "layer_types": [SLIDING if c.window(i) else FULL for i in range(c.n_layers)]}


def layer_types(f: ConfigFields) -> list[str] | None:
    """``layer_types``, checked: one of full_attention / sliding_attention / linear_attention / conv per layer,
    or absent."""
    types = f.data.get("layer_types")
    if types is None:
        return None
    n = f.int("num_hidden_layers")
    if not isinstance(types, list) or len(types) != n:
        raise f.error(f"layer_types must list one kind per layer ({n})")
    bad = next((t for t in types if t not in ("full_attention", "sliding_attention", "linear_attention", "conv")), None)
    if bad is not None or not all(isinstance(t, str) for t in types):
        raise f.error(f"layer_types: {bad!r} is not full_attention, sliding_attention, linear_attention or conv")
    return types


def decoder_config_to_hf(c: DecoderConfig, model_type: str, hf_class: str,
                         biases: tuple[bool, bool, bool] = (False, False, False), window: bool = True,
                         qk_norm: bool = False, experts: bool = False, has: frozenset[Feature] = frozenset()) -> dict[str, Any]:
    """The config.json transformers needs to build ``c`` as ``hf_class``. ``biases``: the (q/k/v, output,
    MLP) biases the model_type has for this config; ``window``: whether it has a window on every layer;
    ``qk_norm``, ``experts``: whether it has q/k norms, routed experts; ``has``: the other features of
    ``features`` it has. A config asking for what the model_type lacks is refused, never written as
    another family (the family adds the fields of its features)."""
    missing = c.features() - typed_features(has) - {Feature.YARN}  # transformers' RoPE has YaRN for every
    if missing:  # model_type of the decoder
        raise ValueError(f"HF's {model_type} has no place for: {', '.join(sorted(missing))}")
    a, r = c.attention, c.rope
    if a.qk_norm != qk_norm:
        raise ValueError(f"HF's {model_type} has {'' if qk_norm else 'no '}RMSNorm on q and k")
    if (c.experts is not None) != experts:
        raise ValueError(f"HF's {model_type} has {'routed experts' if experts else 'no routed experts'}")
    if (a.qkv_bias, a.o_bias, c.mlp.bias) != biases:
        raise ValueError(f"HF's {model_type} has no place for these biases (q/k/v {a.qkv_bias}, output {a.o_bias}, "
                         f"MLP {c.mlp.bias})")
    if a.window is not None and not window:
        raise ValueError(f"HF's {model_type} has no sliding window on every layer")
    rope = rope_to_hf(r, c.head_dim)
    return {
        "architectures": [hf_class], "model_type": model_type,
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.d_ff, "head_dim": c.head_dim, "rms_norm_eps": c.norms.eps, "hidden_act": "silu",
        "rope_parameters": rope, "tie_word_embeddings": c.tie_embeddings, "attention_bias": a.qkv_bias,
        "mlp_bias": c.mlp.bias, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
        "sliding_window": a.window, "pad_token_id": None, "attention_dropout": a.dropout,
        **({"layer_types": [SLIDING if c.window(i) else FULL for i in range(c.n_layers)]} if c.layer_types else {}),
    }


def experts_from_hf(f: ConfigFields, **fields: Any) -> dict[str, Any]:
    """The config's ``experts`` (their count, how many a token uses, their size, whether their weights are
    renormalised, with transformers' defaults, and the family's other ``fields`` of ``Experts``) and
    ``moe_layers``: a layer has experts unless ``mlp_only_layers`` lists it or it is off the
    ``decoder_sparse_step`` (layer i has experts where (i + 1) % step == 0)."""
    named = {k: f.positive(k, None) for k in ("num_experts", "num_local_experts")}  # transformers saves the second
    if None not in named.values() and len(set(named.values())) > 1:
        raise f.error(f"num_experts {named['num_experts']} and num_local_experts {named['num_local_experts']} differ")
    n = f.int("num_hidden_layers")
    step = f.positive("decoder_sparse_step", 1)
    dense = f.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n
                                              for i in dense):
        raise f.error(f"mlp_only_layers must list layer numbers from 0 to {n - 1}")
    experts = Experts(named["num_experts"] or named["num_local_experts"] or 128, f.positive("num_experts_per_tok", 8),
                      f.positive("moe_intermediate_size", 768), renormalise=f.bool("norm_topk_prob", False), **fields)
    return dict(experts=experts, moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(n)))


