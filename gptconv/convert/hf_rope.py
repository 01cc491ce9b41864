"""RoPE as Hugging Face configs say it, both ways: transformers 5's ``rope_parameters`` (keyed by layer type
where a model's sliding layers rotate otherwise) or the legacy ``rope_theta`` / ``rope_scaling``, read into
``layers.rope.Rotary``'s base, scaling and rotated part, and written back (``rope_to_hf``)."""

from __future__ import annotations

import math
from typing import Any

from ..layers.rope import RopeScaling, Rotary, llama3_from_factors
from .hf_config import ConfigFields

FULL, SLIDING = "full_attention", "sliding_attention"  # HF's layer types, as rope_parameters may be keyed


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


def rope_to_hf(r: Rotary, head_dim: int) -> dict[str, Any]:
    """``rope_parameters`` as transformers 5 reads them for ``r`` on heads of ``head_dim``."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": r.theta}
    if r.scaling is not None:
        s = r.scaling
        if s.kind == "factors":  # a GGUF's rope_freqs: HF configs say it as the llama3 scaling that gives them
            s = llama3_from_factors(s.factors, head_dim, r.theta)
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
    if r.dim:
        rope["partial_rotary_factor"] = r.dim / head_dim
    return rope
