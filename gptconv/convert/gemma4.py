"""Gemma 4's layout (``layers/gemma4.py``) in Hugging Face's files: config.json ⇄ Gemma4Config and the key
table. Norms are stored as the weight they scale by (no 1 + w). Global layers' head width and K/V heads
come from ``per_layer_config`` (what transformers saves), else from ``global_head_dim`` and, where keys are
values, ``num_global_key_value_heads`` (what a config written by hand says); transformers gives the global
layers their own K/V head count only where ``attention_k_eq_v``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from gguf import Keys

from ..errors import where
from ..layers.gemma import FULL, SLIDING
from ..layers.gemma4 import Gemma4Config, PLEShape
from ..layers.mlp import Experts
from .gemma import GELU_TANH, _layer_types
from .hf_config import ConfigFields, build_config
from .hf_keys import experts_gate_up
from .gguf_meta import T, block_count, gguf_config, gguf_name
from .keymap import Drop, Fused, KeyMap, Map, Stacked, TensorInfo, Tied

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

_PROPORTIONAL = "proportional"


def gemma4_config_from_hf(data: dict[str, Any], origin: object) -> Gemma4Config:
    f = ConfigFields(data, origin)
    act = f.str("hidden_activation", None) or f.str("hidden_act", GELU_TANH)
    if act != GELU_TANH:
        raise f.error(f"hidden_activation '{act}' is not supported (Gemma's GeGLU uses {GELU_TANH})")
    if f.data.get("use_bidirectional_attention") not in (None, False):
        raise f.error(f"'use_bidirectional_attention': {f.data['use_bidirectional_attention']!r} (bidirectional "
                      "attention) is not supported")
    f.refuse("attention_bias", True, "biases on q, k, v and the output")
    f.refuse("tie_word_embeddings", False, "an LM head untied from the embedding")
    n = f.int("num_hidden_layers")
    if n <= 0:
        raise f.error(f"field 'num_hidden_layers' is {n}; it must be at least 1")
    types = list(_layer_types(f, n, 6))
    if types[-1] != FULL:  # transformers makes the last layer global whatever the config says
        raise f.error("the last layer must be full_attention (transformers forces it)")
    head_dim, kv_heads = f.positive("head_dim", 256), f.positive("num_key_value_heads", 4)
    k_eq_v = f.bool("attention_k_eq_v", False)
    global_dim, global_kv = _global_heads(f, types, head_dim, kv_heads, k_eq_v)
    (theta, fraction), local_theta = _rope(f)
    ple = f.int("hidden_size_per_layer_input", 256) or 0
    moe = f.bool("enable_moe_block", False)
    try:
        ple = PLEShape(ple, f.positive("vocab_size_per_layer_input", 262_144)) if ple else None
        experts = (Experts(f.positive("num_experts", None), f.positive("top_k_experts", None),
                           f.positive("moe_intermediate_size", None)) if moe else None)
    except ValueError as e:
        raise f.error(str(e)) from None
    return build_config(
        Gemma4Config, f,
        **f.common(context_length="max_position_embeddings", d_model="hidden_size", n_layers="num_hidden_layers",
                   n_heads="num_attention_heads"),
        n_kv_heads=kv_heads, d_ff=f.int("intermediate_size"), head_dim=head_dim,
        sliding_window=f.positive("sliding_window", 512), layer_types=tuple(types),
        global_head_dim=global_dim, global_kv_heads=global_kv, norm_eps=f.float("rms_norm_eps", 1e-6),
        rope_theta=theta, global_rope_fraction=fraction, rope_local_theta=local_theta,
        final_logit_softcapping=f.float("final_logit_softcapping", None), k_eq_v=k_eq_v,
        kv_shared_layers=f.int("num_kv_shared_layers", 0), double_wide_mlp=f.bool("use_double_wide_mlp", False),
        ple=ple, experts=experts, family="gemma4")


def _global_heads(f: ConfigFields, types: list[str], head_dim: int, kv_heads: int, k_eq_v: bool) -> tuple[int, int]:
    """(head width, K/V heads) of the global layers: one of each for all of them, the local layers keeping the
    config's own."""
    per_layer = f.dict("per_layer_config", None)
    if per_layer is None:
        dim = f.positive("global_head_dim", 512)
        kv = f.int("num_global_key_value_heads", None) if k_eq_v else None
        return dim, kv or kv_heads
    found: dict[str, set[tuple[int, int]]] = {FULL: set(), SLIDING: set()}
    for i, kind in enumerate(types):
        entry = per_layer.get(str(i), per_layer.get(i, {}))
        if not isinstance(entry, dict) or set(entry) - {"head_dim", "num_key_value_heads"}:
            raise f.error(f"per_layer_config of layer {i}: only head_dim and num_key_value_heads are supported, "
                          f"not {entry!r}")
        found[kind].add((entry.get("head_dim", head_dim), entry.get("num_key_value_heads", kv_heads)))
    if found[SLIDING] - {(head_dim, kv_heads)} or len(found[FULL]) > 1:
        raise f.error("per_layer_config: every global layer must have one head width and K/V head count, and the "
                      "sliding layers the config's own")
    return found[FULL].pop() if found[FULL] else (head_dim, kv_heads)


def _rope(f: ConfigFields) -> tuple[tuple[float, float], float]:
    """((global theta, fraction of the global head's frequencies rotated), local theta)."""
    params = f.dict("rope_parameters", None) or {}
    full = params.get(FULL) or {"rope_type": _PROPORTIONAL, "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
    local = params.get(SLIDING) or {"rope_type": "default", "rope_theta": 10_000.0}
    if not isinstance(full, dict) or not isinstance(local, dict):
        raise f.error("rope_parameters: each layer type's entry must be an object")
    kinds = (full.get("rope_type", "default"), local.get("rope_type", "default"))
    if kinds[0] not in (_PROPORTIONAL, "default") or kinds[1] != "default" or full.get("factor", 1.0) != 1.0:
        raise f.error(f"rope_parameters: {kinds[0]} RoPE on global layers and {kinds[1]} on local ones are not "
                      f"supported (proportional and default, unscaled)")
    fraction = full.get("partial_rotary_factor", 1.0) if kinds[0] == _PROPORTIONAL else 1.0
    return (float(full.get("rope_theta", 1_000_000.0)), float(fraction)), float(local.get("rope_theta", 10_000.0))


def gemma4_config_to_hf(c: Gemma4Config) -> dict[str, Any]:
    """The config.json transformers needs to build Gemma4ForCausalLM for ``c``."""
    if c.global_kv_heads != c.n_kv_heads and not c.k_eq_v:
        raise ValueError("HF's gemma4_text gives global layers K/V heads of their own only where keys are values")
    e = c.experts
    override = {"head_dim": c.global_head_dim, **({"num_key_value_heads": c.global_kv_heads} if c.k_eq_v else {})}
    return {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.d_ff, "head_dim": c.head_dim, "rms_norm_eps": c.norm_eps,
        "hidden_activation": GELU_TANH, "sliding_window": c.sliding_window, "layer_types": list(c.layer_types),
        "per_layer_config": {str(i): override for i in range(c.n_layers) if c.is_global(i)},
        "rope_parameters": {
            FULL: {"rope_type": _PROPORTIONAL, "partial_rotary_factor": c.global_rope_fraction, "rope_theta": c.rope_theta},
            SLIDING: {"rope_type": "default", "rope_theta": c.rope_local_theta}},
        "final_logit_softcapping": c.final_logit_softcapping, "attention_k_eq_v": c.k_eq_v,
        "num_kv_shared_layers": c.kv_shared_layers, "use_double_wide_mlp": c.double_wide_mlp,
        "hidden_size_per_layer_input": c.ple.dim if c.ple else 0,
        "vocab_size_per_layer_input": c.ple.vocab if c.ple else c.vocab_size,
        "enable_moe_block": c.experts is not None, "num_experts": e.count if e else None,
        "top_k_experts": e.used if e else None, "moe_intermediate_size": e.d_ff if e else None,
        "attention_bias": False, "tie_word_embeddings": True, "use_bidirectional_attention": None,
        "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id, "pad_token_id": 0,
    }


_LAYER = [  # (HF name under model.layers.{i}, ours under blocks.{i}), weights unless they end otherwise
    ("input_layernorm", "norm1"), ("post_attention_layernorm", "post_attn_norm"),
    ("pre_feedforward_layernorm", "norm2"), ("post_feedforward_layernorm", "post_mlp_norm"),
    *((f"self_attn.{n}_proj", f"attn.{n}") for n in "qkvo"),
    ("self_attn.q_norm", "attn.q_norm"), ("self_attn.k_norm", "attn.k_norm"),
    *((f"mlp.{n}_proj", f"mlp.{n}") for n in ("gate", "up", "down")),
    ("layer_scalar", "layer_scalar"),
    # per-layer embeddings (E2B, E4B)
    ("per_layer_input_gate", "ple_gate"), ("per_layer_projection", "ple_out"), ("post_per_layer_input_norm", "ple_norm"),
    # the MoE block (26B-A4B)
    ("post_feedforward_layernorm_1", "post_dense_norm"), ("pre_feedforward_layernorm_2", "pre_moe_norm"),
    ("post_feedforward_layernorm_2", "post_moe_norm"), ("router.proj", "router.proj"),
    ("router.scale", "router.scale"), ("router.per_expert_scale", "router.expert_scale"),
]
_NO_WEIGHT_SUFFIX = ("layer_scalar", "router.scale", "router.per_expert_scale", "router.expert_scale")


def _name(name: str) -> str:
    return name if name.endswith(_NO_WEIGHT_SUFFIX) else f"{name}.weight"


def gemma4_hf_keymap(c: Gemma4Config) -> KeyMap:
    """HF's names. A KV-shared layer has no k, v or k norm (Google's files may still hold them, unused: dropped
    by name); a global layer whose keys are values has no v."""
    unused = [Drop(f"model.layers.{i}.self_attn.{n}.weight") for i in range(c.first_shared, c.n_layers)
              for n in ("k_proj", "v_proj", "k_norm")]
    return KeyMap("gemma4_text (Hugging Face)", [
        Map("model.embed_tokens.weight", "tok_emb.weight"),
        Map("model.embed_tokens_per_layer.weight", "ple.table.weight"),
        Map("model.per_layer_model_projection.weight", "ple.proj.weight"),
        Map("model.per_layer_projection_norm.weight", "ple.norm.weight"),
        *(Map(f"model.layers.{{i}}.{_name(src)}", f"blocks.{{i}}.{_name(dst)}") for src, dst in _LAYER),
        *_experts(c),
        Map("model.norm.weight", "norm_f.weight"),
        Tied("lm_head.weight", "tok_emb.weight"),  # the head is the embedding; some files store it again
        *unused,
    ])


def _experts(c: Gemma4Config, gate_up: str = "model.layers.{i}.experts.gate_up_proj",
             down: str = "model.layers.{i}.experts.down_proj") -> list:
    """The routed experts as transformers holds and saves them (and llama.cpp, under ``gate_up`` and ``down``):
    (E, 2·f, d) gate and up, (E, d, f) down."""
    if c.experts is None:
        return []
    return [Fused(gate_up, [f"blocks.{{i}}.experts.experts.{j}.{w}.weight" for j in range(c.experts.count)
                            for w in ("gate", "up")], experts_gate_up(lambda c: c.experts.d_ff)),
            Stacked(down, "blocks.{i}.experts.experts.{j}.down.weight", lambda c: c.experts.count)]


# our step → transformers' module whose output it is
GEMMA4_HF_STEPS = {
    "token_embedding": "model.embed_tokens", "block.{i}.q_norm": "model.layers.{i}.self_attn.q_norm",
    "block.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
    "block.{i}.post_feedforward_norm": "model.layers.{i}.post_feedforward_layernorm",
    "block.{i}": "model.layers.{i}", "final_norm": "model.norm"}


def describe_gemma4(c: Gemma4Config) -> list[str]:
    """``trace``'s lines on how position enters, and what else the config turns on."""
    local = sum(t == SLIDING for t in c.layer_types)
    rotated = int(c.global_rope_fraction * c.global_head_dim // 2) * 2
    lines = [f"position: RoPE on q and k; {local} local layers see their last {c.sliding_window} positions "
             f"(heads of {c.head_dim}, all rotated, theta = {c.rope_local_theta:g}), {c.n_layers - local} global layers "
             f"see all (heads of {c.global_head_dim}, {rotated} of them rotated: proportional RoPE, theta = "
             f"{c.rope_theta:g}); token_embedding is × √d; norms (× w) before and after each sublayer; scores unscaled"]
    extras = []
    if c.k_eq_v:
        extras.append(f"global layers' values are their keys (before k's norm and RoPE), {c.global_kv_heads} K/V heads")
    if c.kv_shared_layers:
        pairs = ", ".join(f"{i}←{c.kv_source(i)}" for i in range(c.first_shared, c.n_layers))
        extras.append(f"KV sharing: the last {c.kv_shared_layers} layers attend to an earlier layer's keys and values "
                      f"({pairs})" + ("; their MLP twice as wide" if c.double_wide_mlp else ""))
    if c.ple is not None:
        extras.append(f"per_layer_embedding: {c.ple.dim} per layer per token (a table of {c.ple.vocab} rows and a "
                      "projection of token_embedding), gated into each block's output (block.i.per_layer_input)")
    if c.experts is not None:
        extras.append(f"MoE block beside the dense MLP in every layer: {c.experts.used} of {c.experts.count} experts "
                      "(block.i.router, block.i.moe)")
    extras.append("each block's output × its layer_scalar")
    if c.final_logit_softcapping is not None:
        extras.append(f"logits soft-capped: c · tanh(x / c), c = {c.final_logit_softcapping:g}")
    return lines + ["also: " + "; ".join(extras)]


# ---------------------------------------------------------------------------------------------------
# GGUF (llama.cpp's gemma4): every tensor as HF stores it (norms as w, the experts' gate and up still fused),
# under llama.cpp's names, and a computed ``rope_freqs``: per frequency of the global head, 1 where it rotates
# and 1e30 where it does not (llama.cpp rotates the whole head, and a frequency ÷ 1e30 is 0).

_GGUF_LAYER = [  # (llama.cpp's tensor, part, ours under blocks.{i})
    (T.ATTN_NORM, "weight", "norm1.weight"), (T.ATTN_POST_NORM, "weight", "post_attn_norm.weight"),
    (T.FFN_NORM, "weight", "norm2.weight"), (T.FFN_POST_NORM, "weight", "post_mlp_norm.weight"),
    (T.ATTN_Q, "weight", "attn.q.weight"), (T.ATTN_K, "weight", "attn.k.weight"), (T.ATTN_V, "weight", "attn.v.weight"),
    (T.ATTN_OUT, "weight", "attn.o.weight"), (T.ATTN_Q_NORM, "weight", "attn.q_norm.weight"),
    (T.ATTN_K_NORM, "weight", "attn.k_norm.weight"),
    (T.FFN_GATE, "weight", "mlp.gate.weight"), (T.FFN_UP, "weight", "mlp.up.weight"),
    (T.FFN_DOWN, "weight", "mlp.down.weight"), (T.LAYER_OUT_SCALE, "weight", "layer_scalar"),
    (T.PER_LAYER_INP_GATE, "weight", "ple_gate.weight"), (T.PER_LAYER_PROJ, "weight", "ple_out.weight"),
    (T.PER_LAYER_POST_NORM, "weight", "ple_norm.weight"),
    (T.FFN_POST_NORM_1, "weight", "post_dense_norm.weight"), (T.FFN_PRE_NORM_2, "weight", "pre_moe_norm.weight"),
    (T.FFN_POST_NORM_2, "weight", "post_moe_norm.weight"), (T.FFN_GATE_INP, "weight", "router.proj.weight"),
    (T.FFN_GATE_INP, "scale", "router.scale"), (T.FFN_DOWN_EXP, "scale", "router.expert_scale"),
]


def gemma4_gguf_keymap(c: Gemma4Config) -> KeyMap:
    experts = _experts(c, gguf_name(T.FFN_GATE_UP_EXP), gguf_name(T.FFN_DOWN_EXP))
    return KeyMap("gemma4 (GGUF)", [
        Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
        Map(gguf_name(T.PER_LAYER_TOKEN_EMBD), "ple.table.weight"),
        Map(gguf_name(T.PER_LAYER_MODEL_PROJ), "ple.proj.weight"),
        Map(gguf_name(T.PER_LAYER_PROJ_NORM), "ple.norm.weight"),
        *(Map(gguf_name(t, part), f"blocks.{{i}}.{ours}") for t, part, ours in _GGUF_LAYER),
        *experts,
        Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight"),
        Tied(gguf_name(T.OUTPUT), "tok_emb.weight"),
        Drop(gguf_name(T.ROPE_FREQS)),  # computed from the config (``gemma4_gguf_tensors``), read back into it
    ])


def gemma4_gguf_tensors(c: Gemma4Config) -> list[tuple[str, torch.Tensor]]:
    """``rope_freqs``: the global layers' proportional RoPE as llama.cpp runs it (all of the head rotated)."""
    rotated = int(c.global_rope_fraction * c.global_head_dim // 2)
    return [(gguf_name(T.ROPE_FREQS), torch.tensor([1.0] * rotated + [1e30] * (c.global_head_dim // 2 - rotated)))]


def gemma4_gguf_metadata(w: GGUFWriter, c: Gemma4Config) -> None:
    """What llama.cpp's converter writes for gemma4, in its order."""
    w.add_block_count(c.n_layers)
    w.add_context_length(c.context_length)
    w.add_embedding_length(c.d_model)
    w.add_feed_forward_length([c.d_ff_at(i) for i in range(c.n_layers)] if c.double_wide_mlp else c.d_ff)
    w.add_head_count(c.n_heads)
    # per layer where the global layers have K/V heads of their own (transformers: only where keys are values)
    w.add_head_count_kv([c.kv_heads_at(i) for i in range(c.n_layers)] if c.k_eq_v else c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_rope_freq_base_swa(c.rope_local_theta)
    w.add_layer_norm_rms_eps(c.norm_eps)
    if c.experts is not None:
        w.add_expert_count(c.experts.count)
        w.add_expert_used_count(c.experts.used)
    w.add_key_length(c.global_head_dim)
    w.add_value_length(c.global_head_dim)
    if c.final_logit_softcapping:
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    w.add_sliding_window(c.sliding_window)
    w.add_shared_kv_layers(c.kv_shared_layers)
    w.add_embedding_length_per_layer_input(c.ple.dim if c.ple else 0)
    w.add_sliding_window_pattern([not c.is_global(i) for i in range(c.n_layers)])
    w.add_key_length_swa(c.head_dim)
    w.add_value_length_swa(c.head_dim)
    if c.experts is not None:
        w.add_expert_feed_forward_length(c.experts.d_ff)
    w.add_rope_dimension_count(c.global_head_dim)  # the whole head: rope_freqs leaves the rest unrotated
    w.add_rope_dimension_count_swa(c.head_dim)


def gemma4_config_from_gguf(f: GGUFFields, tensors: dict[str, TensorInfo]) -> Gemma4Config:
    """A config from llama.cpp's gemma4 metadata and ``rope_freqs`` (how much of the global head rotates)."""
    n = block_count(f, tensors)
    sliding = f.get(Keys.Attention.SLIDING_WINDOW_PATTERN, list, None)
    if not isinstance(sliding, list) or len(sliding) != n or not all(isinstance(s, bool) for s in sliding):
        raise where(f.path, f"attention.sliding_window_pattern must say for each of the {n} layers whether it slides")
    if sliding[-1]:  # what transformers makes of a config that says otherwise; llama.cpp runs the file as it says
        raise where(f.path, "attention.sliding_window_pattern: the last layer slides; Gemma 4's last layer is global")
    per_layer_kv, per_layer_ff = _per_layer(f, Keys.Attention.HEAD_COUNT_KV, n), _per_layer(f, Keys.LLM.FEED_FORWARD_LENGTH, n)
    local_kv = {k for k, s in zip(per_layer_kv, sliding) if s} or {per_layer_kv[0]}
    global_kv = {k for k, s in zip(per_layer_kv, sliding) if not s} or local_kv
    shared = f.get(Keys.Attention.SHARED_KV_LAYERS, int, 0)
    if len(local_kv) > 1 or len(global_kv) > 1:
        raise where(f.path, "head_count_kv: every local layer must have one K/V head count, every global one another")
    d_ff = per_layer_ff[0]
    double = per_layer_ff != [d_ff] * n
    if double and per_layer_ff != [d_ff if i < n - shared else 2 * d_ff for i in range(n)]:
        raise where(f.path, "feed_forward_length: only the KV-shared layers' MLPs may be wider (twice)")
    global_dim = f.get(Keys.Attention.KEY_LENGTH, int)
    freqs = tensors.get(gguf_name(T.ROPE_FREQS))
    if freqs is None or tuple(freqs.shape) != (global_dim // 2,):
        raise where(f.path, f"rope_freqs must hold the {global_dim // 2} frequencies of the global head")
    factors = freqs.load().float()
    rotated = int((factors == 1.0).sum())
    if not (torch.equal(factors[:rotated], torch.ones(rotated)) and bool((factors[rotated:] >= 1e29).all())):
        raise where(f.path, "rope_freqs: only proportional RoPE (ones, then 1e30) is supported")
    count, ple = f.get(Keys.LLM.EXPERT_COUNT, int, 0), f.get(Keys.LLM.EMBD_LENGTH_PER_LAYER_INP, int, 0)
    table = tensors.get(gguf_name(T.PER_LAYER_TOKEN_EMBD))
    try:
        ple = PLEShape(ple, table.shape[0] if table is not None else 0) if ple else None
        experts = (Experts(count, f.get(Keys.LLM.EXPERT_USED_COUNT, int, 0),
                           f.get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int, 0)) if count else None)
    except ValueError as e:
        raise where(f.path, str(e)) from None
    return gguf_config(
        Gemma4Config, f, tensors, n_kv_heads=local_kv.pop(), d_ff=d_ff,
        head_dim=f.get(Keys.Attention.KEY_LENGTH_SWA, int), sliding_window=f.get(Keys.Attention.SLIDING_WINDOW, int),
        layer_types=tuple(SLIDING if s else FULL for s in sliding), global_head_dim=global_dim,
        global_kv_heads=global_kv.pop(), norm_eps=f.get(Keys.Attention.LAYERNORM_RMS_EPS, float),
        rope_theta=f.get(Keys.Rope.FREQ_BASE, float), global_rope_fraction=2 * rotated / global_dim,
        rope_local_theta=f.get(Keys.Rope.FREQ_BASE_SWA, float),
        final_logit_softcapping=f.get(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, float, None),
        k_eq_v=_keys_are_values(tensors, sliding, n - shared),
        kv_shared_layers=shared, double_wide_mlp=double, ple=ple, experts=experts, family="gemma4")


def _per_layer(f: GGUFFields, key: str, n: int) -> list[int]:
    """A key that holds one positive integer, or one per layer."""
    value = f.get(key, object)
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values) or len(values) not in (1, n):
        raise where(f.path, f"{key.format(arch='gemma4')} must be a positive integer, or one for each of the {n} layers")
    return values * n if len(values) == 1 else values


def _keys_are_values(tensors: dict, sliding: list[bool], unshared: int) -> bool:
    """Whether the global layers' values are their keys: an unshared global layer with k and no v."""
    name = lambda t, i: gguf_name(t).replace("{i}", str(i))  # noqa: E731
    own = [i for i in range(unshared) if not sliding[i]]
    return bool(own) and name(T.ATTN_K, own[0]) in tensors and name(T.ATTN_V, own[0]) not in tensors
