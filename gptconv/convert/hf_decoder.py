"""Hugging Face's layout of the Llama decoder (``layers/decoder.py``), shared by the families built on
it: config.json fields every such model_type has, RoPE parameters, sliding windows, the standard key
rows (``model.layers.{i}.self_attn.q_proj`` …) and the modules verify compares step by step. A family
file passes what is its own (biases, a window rule, q/k norms, experts, fused rows)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import math

import torch

from ..layers.decoder import FULL, SLIDING, LlamaConfig
from ..layers.mlp import Experts
from ..layers.rope import RopeScaling, llama3_from_factors
from .gguf_decoder import PERMUTE_K, PERMUTE_Q
from .hf_config import ConfigFields, build_config
from .keymap import Drop, Fuse, Fused, KeyMap, Map, Rule, Stacked, Tied
from .mtp import mtp_hf_rows

# our step → transformers' module whose output it is
DECODER_HF_STEPS = {"token_embedding": "model.embed_tokens", "block.{i}": "model.layers.{i}",
                    "final_norm": "model.norm"}


def rope_from_hf(f: ConfigFields, default_theta: float = 10000.0,
                 partial: bool = False) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from transformers 5's ``rope_parameters`` or the legacy ``rope_theta`` / ``rope_scaling``.
    A ``rope_scaling`` beside ``rope_parameters`` wins, as it does in transformers. ``partial``: the family
    rotates part of each head where the config says so (``rope_dim_from_hf``); else that is refused."""
    p = rope_parameters(f, default_theta)
    theta = p.float("rope_theta", default_theta)
    kind = p.str("rope_type", None) or p.str("type", None) or "default"
    if p.float("partial_rotary_factor", 1.0) != 1.0 and not partial:
        raise p.error("partial_rotary_factor != 1 (RoPE on part of each head) is not supported")
    _check_mrope_section(f, p)
    try:
        if kind == "default":
            return theta, None
        if kind == "linear":
            return theta, RopeScaling("linear", factor=p.float("factor"))
        if kind == "llama3":
            return theta, RopeScaling("llama3", factor=p.float("factor"), low_freq_factor=p.float("low_freq_factor"),
                                      high_freq_factor=p.float("high_freq_factor"),
                                      original_context_length=p.int("original_max_position_embeddings"))
        if kind == "longrope":
            return theta, _longrope(f, p)
        if kind == "yarn":
            return theta, _yarn(f, p)
    except ValueError as e:
        raise p.error(str(e)) from None
    raise p.error(f"rope_type '{kind}' is not supported (default, linear, llama3, longrope, yarn)")


def _check_mrope_section(f: ConfigFields, p: ConfigFields) -> None:
    """M-RoPE's sections (the vision-language models' ``mrope_section``): on text they are plain RoPE, so we
    do not read them, but transformers' reference does: non-negative integers that share the rotated half
    of each head (head_dim × partial_rotary_factor / 2), or its model fails inside."""
    sections = p.data.get("mrope_section")
    if sections is None:
        return
    heads = f.int("num_attention_heads", None)
    head_dim = f.int("head_dim", None) or (f.int("hidden_size") // heads if heads else None)
    if not (isinstance(sections, list) and sections
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sections)):
        raise p.error(f"field 'mrope_section' {sections!r} is not a list of non-negative integers")
    half = int(head_dim * p.float("partial_rotary_factor", 1.0)) // 2 if head_dim else None
    if half is not None and sum(sections) != half:
        raise p.error(f"field 'mrope_section' {sections} adds up to {sum(sections)}, not to the {half} rotated "
                      "frequencies of a head")


def _yarn(f: ConfigFields, p: ConfigFields) -> RopeScaling:
    """YaRN as transformers reads it: factor (absent: the context over the original one); attention factor
    given, or 0.1·ln(factor) + 1 (DeepSeek's mscale / mscale_all_dim ratio where both are given)."""
    original = _original_context(f, p)
    factor = p.positive_float("factor", None) or f.int("max_position_embeddings") / original
    mscale = lambda scale, m=1.0: 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0  # noqa: E731
    attention = p.float("attention_factor", None)
    if attention is None:
        m, m_all = p.float("mscale", None), p.float("mscale_all_dim", None)
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return RopeScaling("yarn", factor=factor, original_context_length=original, attention_factor=attention,
                       beta_fast=p.positive_float("beta_fast", 32.0), beta_slow=p.positive_float("beta_slow", 1.0),
                       truncate=p.bool("truncate", True))


def _original_context(f: ConfigFields, p: ConfigFields) -> int:
    """original_max_position_embeddings: the scaling's own, else the config's; at least 1 where given."""
    original = p.positive("original_max_position_embeddings", None)
    if original is None:
        original = f.positive("original_max_position_embeddings", None)
    return original if original is not None else f.int("original_max_position_embeddings")  # absent: its error


def _longrope(f: ConfigFields, p: ConfigFields) -> RopeScaling:
    """LongRoPE as transformers computes it: factor (absent: the context over the original one) sets the
    attention factor √(1 + ln factor / ln original) where none is given."""
    original = _original_context(f, p)
    factor = p.positive_float("factor", None) or f.int("max_position_embeddings") / original
    attention = p.float("attention_factor", None)
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    factors = {}
    for name in ("short_factor", "long_factor"):
        values = p.data.get(name)
        if not isinstance(values, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   for x in values):
            raise p.error(f"field '{name}' must be a list of numbers")
        factors[name] = tuple(float(x) for x in values)
    return RopeScaling("longrope", factor=factor, original_context_length=original, factors=factors["short_factor"],
                       long_factors=factors["long_factor"], attention_factor=attention)


def rope_dim_from_hf(f: ConfigFields, head_dim: int) -> int:
    """The dimensions of each head RoPE rotates: head_dim × partial_rotary_factor (as transformers rounds it)."""
    factor = rope_parameters(f).float("partial_rotary_factor", 1.0)
    if not 0.0 < factor <= 1.0:
        raise f.error(f"partial_rotary_factor {factor!r} is outside (0, 1]")
    return int(head_dim * factor)


def rope_parameters(f: ConfigFields, default_theta: float = 10000.0) -> ConfigFields:
    """The RoPE parameters however the config says them (``rope_parameters``, legacy fields)."""
    params = dict(f.dict("rope_parameters", None) or {})
    legacy = f.dict("rope_scaling", None)
    if legacy or not params:  # legacy: theta at top level, scaling (if any) in rope_scaling with 'type' or 'rope_type'
        params = {"rope_theta": params.get("rope_theta", f.float("rope_theta", default_theta)), **(legacy or {})}
    if "partial_rotary_factor" in f.data:  # some configs say it at top level
        params.setdefault("partial_rotary_factor", f.float("partial_rotary_factor"))
    return ConfigFields(params, f"{f.origin} (rope parameters)")


def decoder_config_from_hf(f: ConfigFields, family: str, defaults: dict[str, Any], **specific: Any) -> LlamaConfig:
    """The fields every model_type of the decoder has; ``defaults``: transformers' values for the fields a
    config.json may leave out, where they are not Llama's (rms_norm_eps 1e-6, rope_theta 1e4);
    ``specific``: the family's own (biases, window, q/k norms, experts); ``partial_rotary``: the family
    rotates part of each head where the config says so."""
    act = f.str("hidden_act", "silu")
    if act != "silu":
        raise f.error(f"hidden_act '{act}' is not supported (SwiGLU uses silu)")
    partial = specific.pop("partial_rotary", False)
    theta, scaling, local_theta = rope_by_layer_type(f, defaults.get("rope_theta", 10000.0), partial)
    if local_theta is not None:
        specific["rope_local_theta"] = local_theta
    if partial:
        head_dim = f.positive("head_dim", 0) or f.int("hidden_size") // max(f.int("num_attention_heads"), 1)
        specific["rope_dim"] = rope_dim_from_hf(f, head_dim)
    if f.data.get("pretraining_tp", 1) not in (1, None):
        raise f.error(f"'pretraining_tp' = {f.data['pretraining_tp']!r} is not supported")
    # dropouts and noise that act in training only, which our modules do not have
    untrained = tuple(f"{name} {f.data[name]}" for name in ("resid_pdrop", "embd_pdrop", "router_jitter_noise")
                      if f.float(name, 0.0))
    # layer_types checked whatever the family makes of them; recurrent layers only where the family has them
    for kind, field in (("linear_attention", "linear_attention"), ("conv", "short_conv")):
        if kind in (layer_types(f) or ()) and field not in specific:
            raise f.error(f"layer_types has {kind} layers, which model_type {family} does not have")
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
        attention_dropout=f.float("attention_dropout", 0.0),
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
    the layers ``layer_types`` says, else those from ``max_window_layers`` on: sliding_window, layer_types."""
    types = layer_types(f)
    if not f.bool("use_sliding_window", False):
        no_window(f)
        return dict(sliding_window=None)
    n = f.int("num_hidden_layers")
    if types is None:
        first = f.int("max_window_layers", max_window_layers)
        types = [SLIDING if i >= first else FULL for i in range(n)]
    return windows_of_layer_types(f, types)


def windows_of_layer_types(f: ConfigFields, types: list[str] | None) -> dict[str, Any]:
    """sliding_window and layer_types for a config whose ``types`` (one per layer, or None: none slides)
    say which layers slide; the window is ``sliding_window``, which must be set where some layer slides."""
    if not types or SLIDING not in types:
        return dict(sliding_window=None)
    if f.data.get("sliding_window") is None:
        raise f.error("'sliding_window' is null or absent but some layers are sliding_attention")
    return dict(sliding_window=f.positive("sliding_window", None), layer_types=tuple(types))


def windows_to_hf(c: LlamaConfig) -> dict[str, Any]:
    """The window fields of a model_type that windows only with ``use_sliding_window`` and says which
    layers in ``layer_types`` (Qwen2, Qwen3): every layer's kind written out."""
    if c.sliding_window is None:
        return {"use_sliding_window": False, "sliding_window": None}
    return {"use_sliding_window": True, "sliding_window": c.sliding_window, "max_window_layers": 0,
            "layer_types": [SLIDING if c.window(i) else FULL for i in range(c.n_layers)]}


def rope_by_layer_type(f: ConfigFields, default_theta: float = 10000.0,
                       partial: bool = False) -> tuple[float, RopeScaling | None, float | None]:
    """(theta, scaling, the sliding layers' theta where theirs differs) of a config whose ``rope_parameters``
    may be keyed by layer type (OLMo 3: YaRN on its full layers only). The sliding layers' RoPE may differ
    in its base, and be unscaled; anything else is refused."""
    params = f.dict("rope_parameters", None)
    if not params or not (FULL in params or SLIDING in params):
        return (*rope_from_hf(f, default_theta, partial), None)
    kinds = []
    for kind in (FULL, SLIDING):
        entry = params.get(kind) or {}
        if not isinstance(entry, dict):
            raise f.error(f"rope_parameters['{kind}'] must be an object")
        kinds.append(rope_from_hf(ConfigFields({"rope_parameters": entry}, f"{f.origin} ({kind})"), default_theta,
                                  partial))
    if kinds[0] == kinds[1]:
        return (*kinds[0], None)
    if kinds[1][1] is not None:
        raise f.error("RoPE scaling on the sliding layers different from the full layers' is not supported")
    return (*kinds[0], kinds[1][0])


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


def decoder_config_to_hf(c: LlamaConfig, model_type: str, hf_class: str,
                         biases: tuple[bool, bool, bool] = (False, False, False), window: bool = True,
                         qk_norm: bool = False, experts: bool = False, has: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The config.json transformers needs to build ``c`` as ``hf_class``. ``biases``: the (q/k/v, output,
    MLP) biases the model_type has for this config; ``window``: whether it has a window on every layer;
    ``qk_norm``, ``experts``: whether it has q/k norms, routed experts; ``has``: the other features of
    ``features`` it has. A config asking for what the model_type lacks is refused, never written as
    another family (the family adds the fields of its features)."""
    missing = c.features() - has - {"yarn"}  # transformers' RoPE has YaRN for every model_type of the decoder
    if missing:
        raise ValueError(f"HF's {model_type} has no place for: {', '.join(sorted(missing))}")
    if c.qk_norm != qk_norm:
        raise ValueError(f"HF's {model_type} has {'' if qk_norm else 'no '}RMSNorm on q and k")
    if (c.experts is not None) != experts:
        raise ValueError(f"HF's {model_type} has {'routed experts' if experts else 'no routed experts'}")
    if (c.qkv_bias, c.o_bias, c.mlp_bias) != biases:
        raise ValueError(f"HF's {model_type} has no place for these biases (q/k/v {c.qkv_bias}, output {c.o_bias}, "
                         f"MLP {c.mlp_bias})")
    if c.sliding_window is not None and not window:
        raise ValueError(f"HF's {model_type} has no sliding window on every layer")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling is not None:
        s = c.rope_scaling
        if s.kind == "factors":  # a GGUF's rope_freqs: HF configs say it as the llama3 scaling that gives them
            s = llama3_from_factors(s.factors, c.head_dim, c.rope_theta)
        rope.update({"rope_type": s.kind, "factor": s.factor})
        if s.kind == "llama3":
            rope.update({"low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                         "original_max_position_embeddings": s.original_context_length})
        if s.kind == "yarn":
            rope.update({"original_max_position_embeddings": s.original_context_length,
                         "attention_factor": s.attention_factor, "beta_fast": s.beta_fast, "beta_slow": s.beta_slow,
                         "truncate": s.truncate})
        if s.kind == "longrope":
            rope.update({"short_factor": list(s.factors), "long_factor": list(s.long_factors),
                         "attention_factor": s.attention_factor,
                         "original_max_position_embeddings": s.original_context_length})
    if c.rope_dim:
        rope["partial_rotary_factor"] = c.rope_dim / c.head_dim
    return {
        "architectures": [hf_class], "model_type": model_type,
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.d_ff, "head_dim": c.head_dim, "rms_norm_eps": c.norm_eps, "hidden_act": "silu",
        "rope_parameters": rope, "tie_word_embeddings": c.tie_embeddings, "attention_bias": c.qkv_bias,
        "mlp_bias": c.mlp_bias, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
        "sliding_window": c.sliding_window, "pad_token_id": None, "attention_dropout": c.attention_dropout,
        **({"layer_types": [SLIDING if c.window(i) else FULL for i in range(c.n_layers)]} if c.layer_types else {}),
    }


# (HF name under model.layers.{i}, ours under blocks.{i}) of the standard layer
NORMS = [("input_layernorm.weight", "norm1.weight"), ("post_attention_layernorm.weight", "norm2.weight")]
ATTENTION = [(f"self_attn.{n}_proj.{p}", f"attn.{n}.{p}") for n in "qkvo" for p in ("weight", "bias")]
MLP = [(f"mlp.{n}_proj.{p}", f"mlp.{n}.{p}") for n in ("gate", "up", "down") for p in ("weight", "bias")]
QK_NORM = [("self_attn.q_norm.weight", "attn.q_norm.weight"), ("self_attn.k_norm.weight", "attn.k_norm.weight")]
# norms on each sublayer's output (OLMo 2, EXAONE 4): HF's post_attention_layernorm is this, not Llama's pre-MLP norm
POST_NORMS = [("post_attention_layernorm.weight", "post_attn_norm.weight"),
              ("post_feedforward_layernorm.weight", "post_mlp_norm.weight")]
POST_NORM_STEPS = {"block.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
                   "block.{i}.post_feedforward_norm": "model.layers.{i}.post_feedforward_layernorm"}
# q and k rows of a model_type whose RoPE rotates interleaved pairs (x₀, x₁), (x₂, x₃), … (ERNIE 4.5;
# llama.cpp's NORM RoPE): its rows are in llama.cpp's llama order, which PERMUTE_Q / PERMUTE_K reorder into
# our rotate-half order (and back at export). Attention sees the same scores either way: q·k sums over the same pairs.
INTERLEAVED_QK = [Map(f"model.layers.{{i}}.self_attn.{n}_proj.{p}", f"blocks.{{i}}.attn.{n}.{p}", t)
                  for n, t in (("q", PERMUTE_Q), ("k", PERMUTE_K)) for p in ("weight", "bias")]
VO = [row for row in ATTENTION if row[1].startswith(("attn.v.", "attn.o."))]
QK_NORM_STEPS = {"block.{i}.q_norm": "model.layers.{i}.self_attn.q_norm",
                 "block.{i}.k_norm": "model.layers.{i}.self_attn.k_norm"}


def experts_gate_up(size: Callable[[Any], int]) -> Fuse:
    """transformers 5's module holds every expert's gate and up rows as one (E, 2·d_ff, d) tensor:
    expert e's gate rows, then its up rows. Parts in the order [gate 0, up 0, gate 1, up 1, …];
    ``size``: each expert's hidden size, from the config."""

    def shapes(s: tuple[int, ...], c: LlamaConfig) -> list[tuple[int, ...]]:
        if len(s) != 3 or s[1] != 2 * size(c):
            return [s]  # cannot be split so: the ledger reports the shape
        return [(size(c), s[2])] * (2 * s[0])
    return Fuse("experts_gate_up", lambda t, c: [p for e in t.unbind(0) for p in e.split(size(c), 0)],
                lambda ts, c: torch.stack([torch.cat(ts[k:k + 2], 0) for k in range(0, len(ts), 2)]), shapes)


# the router and each expert's SwiGLU, as the files store them (the router is mlp.gate in both layouts)
EXPERT_ROWS = [("mlp.gate.weight", "mlp.router.weight"),
               *((f"mlp.experts.{{j}}.{n}_proj.weight", f"mlp.experts.{{j}}.{n}.weight")
                 for n in ("gate", "up", "down"))]


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


def fused_experts(config: LlamaConfig) -> list[Rule]:
    """A layer's experts as transformers 5's module holds them (Mixtral, Qwen3-MoE), and saves them with
    save_original_format=False: two 3-D tensors under mlp.experts (the router is the family's own row)."""
    experts = range(config.experts.count)
    return [Fused("model.layers.{i}.mlp.experts.gate_up_proj",
                  [f"blocks.{{i}}.mlp.experts.{j}.{w}.weight" for j in experts for w in ("gate", "up")],
                  experts_gate_up(lambda c: c.experts.d_ff or c.d_ff)),
            Stacked("model.layers.{i}.mlp.experts.down_proj", "blocks.{i}.mlp.experts.{j}.down.weight",
                    lambda c: c.experts.count)]


def decoder_hf_keymap(config: LlamaConfig, model_type: str, layer: list[tuple[str, str]], fused: list[Rule] = (),
                      fused_first: bool = False, extra: list[Rule] = (),
                      final_norm: str = "model.norm.weight", mtp: bool = False) -> KeyMap:
    """HF names need no transform: HF's q/k rows are already in rotate-half order. Bias rows that the
    config does not enable are absent from the model, and so reported if a file has them. ``layer``:
    the (HF, ours) pairs under each layer; ``fused``: rows beyond a rename (tensors HF stores as one,
    rows reordered), listed after the plain rows (``fused_first``: before them, so that the inverse names those);
    ``extra``: rows outside the layers (tensors dropped on purpose); ``final_norm``: the final norm's name;
    ``mtp``: the family's files may hold multi-token-prediction layers (``convert/mtp.py``)."""
    head = (Tied("lm_head.weight", "tok_emb.weight") if config.tie_embeddings
            else Map("lm_head.weight", "lm_head.weight"))
    rows = [Map(f"model.layers.{{i}}.{src}", f"blocks.{{i}}.{dst}") for src, dst in layer]
    layers = (list(fused) + rows) if fused_first else (rows + list(fused))
    return KeyMap(f"{model_type} (Hugging Face)", [
        Map("model.embed_tokens.weight", "tok_emb.weight"),
        *layers,
        Map(final_norm, "norm_f.weight"),
        head,
        Drop("model.layers.{i}.self_attn.rotary_emb.inv_freq"),  # older files saved RoPE's buffer
        *extra,
        *(mtp_hf_rows(layers) if mtp else []),
    ])


def describe_decoder(cfg: LlamaConfig) -> list[str]:
    """``trace``'s lines on how position enters, and what else the config turns on."""
    scaling = f", {cfg.rope_scaling.kind} scaling" if cfg.rope_scaling else ""
    local = (f"; sliding layers: theta = {cfg.rope_local_theta:g} unscaled" if cfg.rope_local_theta is not None
             else "")
    lines = [f"position: no position embedding; RoPE (theta = {cfg.rope_theta:g}{scaling}{local}) rotates Q and K "
             f"inside every attention layer; GQA: {cfg.n_heads} query heads share {cfg.n_kv_heads} K/V heads"]
    n = cfg.n_layers
    linear = [i for i in range(n) if cfg.linear_at(i)]
    if linear:
        s = cfg.linear_attention
        full = [i for i in range(n) if not cfg.linear_at(i)]
        lines.append(f"mixing positions: attention in layers {', '.join(map(str, full)) or 'none'}; linear attention "
                     f"(a gated delta rule, no position signal but order) in {len(linear)} layers "
                     f"({', '.join(map(str, linear))}): each keeps a state of {s.v_heads} heads × {s.k_dim} × {s.v_dim} "
                     f"and a {s.conv_kernel}-tap convolution, the same size at any length")
    conv = [i for i in range(n) if cfg.conv_at(i)]
    if conv:
        k = cfg.short_conv.kernel
        full = [i for i in range(n) if not cfg.conv_at(i)]
        lines.append(f"mixing positions: attention in layers {', '.join(map(str, full)) or 'none'}; a gated short "
                     f"convolution (out(C ⊙ conv(B ⊙ x)): each position sees its last {k}, order by the taps) in "
                     f"{len(conv)} layers ({', '.join(map(str, conv))}): each keeps its last {k - 1} inputs")
    sliding = sum(cfg.window(i) is not None for i in range(n))
    nope = [i for i in range(n) if not cfg.rope_at(i)]
    extras = []
    if sliding:
        which = "each layer" if sliding == n else f"{sliding} of {n} layers (the others see every position)"
        extras.append(f"{which}: each position sees the last {cfg.sliding_window} only (sliding window)")
    if nope:
        extras.append(f"NoPE layers (no RoPE: order only through the causal mask): {', '.join(map(str, nope))}")
    if cfg.rope_dim:
        extras.append(f"partial rotary: RoPE on the first {cfg.rope_dim} of {cfg.head_dim} dimensions of each head")
    if cfg.rope_scaling is not None and cfg.rope_scaling.kind == "longrope":
        extras.append(f"longrope: long factors past {cfg.rope_scaling.original_context_length} positions, "
                      f"cos and sin × {cfg.rope_scaling.attention_factor:.4g}")
    if cfg.qk_norm:
        extras.append("q and k " + ("RMS-normed over the whole projection" if cfg.qk_norm_over == "all"
                                    else "heads RMS-normed") + " before RoPE")
    if cfg.norms != "pre":
        extras.append({"post": "norms after each sublayer, on its output, before the residual add (none before)",
                       "sandwich": "norms before and after each sublayer"}[cfg.norms])
    if "µP multipliers" in cfg.features():
        m = cfg.multipliers
        scale = "head_dim^-½" if m.attention is None else f"{m.attention:g}"
        extras.append(f"µP: token_embedding × {m.embedding:g}, each sublayer's output × "
                      f"{m.residual:g}, attention scores × {scale}, logits ÷ {m.logits:g}")
    if (e := cfg.experts) is not None:
        dense = n - sum(cfg.experts_at(i) for i in range(n))
        extras.append(f"MLP: {e.used} of {e.count} experts per token"
                      + ("" if e.renormalise else " (weights not renormalised)")
                      + (f"; {dense} dense layers" if dense else "")
                      + (f"; a shared expert of {e.shared_d_ff} on every token" if e.shared_d_ff else ""))
    if cfg.attention_gate:
        extras.append("attention's output × sigmoid(gate(x)) before its projection")
    if cfg.offset_norms:
        extras.append("RMSNorms scale by 1 + w")
    if cfg.mtp_layers:
        extras.append(f"{cfg.mtp_layers} multi-token-prediction layer(s) (a draft head) held for export, not run")
    return lines + (["also: " + "; ".join(extras)] if extras else [])
