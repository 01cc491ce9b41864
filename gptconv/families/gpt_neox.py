"""GPT-NeoX (HF gpt_neox; GGUF gptneox): Pythia 14M–12B and the deduped suite, GPT-NeoX-20B. The decoder
with LayerNorm (weight and bias) for RMSNorm, an ungated GELU MLP with biases, biases on every attention
projection, RoPE on the first quarter of each head (``rotary_pct``), and a parallel residual:
x + attn(norm1(x)) + mlp(norm2(x)) (``use_parallel_residual``; false: the sequential block). q, k and v are one
``query_key_value`` tensor, interleaved by head ([q_h, k_h, v_h] for each head h); llama.cpp's ``attn_qkv``
concatenates them ([q, k, v]). Every part exists in ``gptconv/layers/``: this file only says which."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from gguf import Keys

from ..convert.gguf_decoder import decoder_config_from_gguf, refuse_experts
from ..convert.gguf_meta import T, gguf_name
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, no_window
from ..convert.hf_rope import rope_to_hf
from ..convert.keymap import Drop, Fuse, Fused, KeyMap, Map, Tied, concat
from ..describe import describe_decoder
from ..errors import GptconvError
from ..layers.decoder import Decoder, DecoderConfig, Feature, typed_features
from ..layers.rope import Rotary
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

_PARTS = dict(attention=dict(qkv_bias=True, o_bias=True), mlp=dict(gated=False, act="gelu", bias=True))


def _pythia(d: int, layers: int, heads: int, vocab: int = 50304) -> DecoderConfig:
    """A Pythia model (EleutherAI's config.json: 2048 positions, RoPE on a quarter of each head, parallel
    residual, untied, BOS = EOS = 0)."""
    return DecoderConfig.build(vocab_size=vocab, context_length=2048, d_model=d, n_layers=layers, n_heads=heads,
                               n_kv_heads=heads, d_ff=4 * d, rope=dict(dim=d // heads // 4),
                               norms=dict(kind="layer", place="parallel"), bos_token_id=0, eos_token_id=0,
                               family="gpt_neox", **_PARTS)


# the parameter counts are those the Pythia suite's model cards publish (EleutherAI/pythia), and the
# GPT-NeoX-20B paper's 20,554,567,680; parity_tests/test_family_gpt_neox.py builds each and counts
PRESETS: dict[str, Preset] = {
    **{f"pythia-{name}": Preset(_pythia(*shape), f"EleutherAI/pythia-{name}") for name, shape in (
        ("70m", (512, 6, 8)), ("160m", (768, 12, 12)), ("410m", (1024, 24, 16)), ("1b", (2048, 16, 8)),
        ("1.4b", (2048, 24, 16)), ("2.8b", (2560, 32, 32)), ("6.9b", (4096, 32, 32, 50432)),
        ("12b", (5120, 36, 40, 50688)))},
    "gpt-neox-20b": Preset(_pythia(6144, 44, 64, 50432), "EleutherAI/gpt-neox-20b"),
}

_HAS = frozenset({Feature.PARTIAL_ROTARY, Feature.PARALLEL_RESIDUAL, Feature.LAYER_NORM, Feature.UNGATED_MLP,
                  Feature.MLP_ACTIVATION})
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": None}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    """transformers' reading: the legacy ``rotary_pct`` / ``rotary_emb_base`` where ``rope_parameters`` lacks
    them (absent: a quarter of each head, base 10000, as transformers defaults), ``layer_norm_eps``."""
    params = dict(data.get("rope_scaling") or data.get("rope_parameters") or {})
    if not isinstance(params, dict):
        raise GptconvError(f"{origin}: field 'rope_parameters' must be an object")
    params.setdefault("rope_theta", data.get("rotary_emb_base", 10000.0))
    params.setdefault("partial_rotary_factor", data.get("rotary_pct", 0.25))
    f = ConfigFields({**data, "rope_parameters": params}, origin)
    f.data.pop("rope_scaling", None)
    no_window(f)
    if f.bool("attention_bias", True) is not True:
        raise f.error("attention_bias false (GPT-NeoX without attention biases) is not supported")
    act = f.str("hidden_act", "gelu")
    if _ACTS.get(act) is None:
        raise f.error(f"hidden_act '{act}' is not supported (gelu, gelu_new, gelu_pytorch_tanh)")
    parallel = f.bool("use_parallel_residual", True)
    return decoder_config_from_hf(
        f, "gpt_neox", {}, partial_rotary=True, training_only=("hidden_dropout",),
        norms=dict(eps=f.float("layer_norm_eps", 1e-5), kind="layer", place="parallel" if parallel else "pre"),
        attention=_PARTS["attention"], mlp={**_PARTS["mlp"], "act": _ACTS[act]})


def _check(c: DecoderConfig, where: str) -> None:
    """What GPT-NeoX has a place for: the features above, and nothing of Llama's it lacks."""
    missing = c.features() - typed_features(_HAS)
    problems = [*sorted(missing), *(what for what, bad in (
        ("RMSNorm", c.norms.kind != "layer"), ("an MLP without biases or a gated one", c.mlp.gated or not c.mlp.bias),
        ("attention without biases", not (c.attention.qkv_bias and c.attention.o_bias)),
        ("grouped K/V heads", c.n_kv_heads != c.n_heads), ("a head size other than d / heads",
                                                              c.head_dim * c.n_heads != c.d_model),
        ("q/k norms", c.attention.qk_norm)) if bad)]
    if problems:
        raise GptconvError(f"{where} has no place for: {', '.join(problems)}")


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    """transformers 5's fields, and the legacy ``rotary_pct`` / ``rotary_emb_base`` beside them (llama.cpp's
    converter reads only those)."""
    _check(c, "HF's gpt_neox")
    rope = rope_to_hf(c.rope, c.head_dim)
    rope.setdefault("partial_rotary_factor", 1.0)
    return {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
        "hidden_act": {"gelu": "gelu", "gelu_tanh": "gelu_new"}[c.mlp.act], "layer_norm_eps": c.norms.eps,
        "rope_parameters": rope, "rotary_pct": rope["partial_rotary_factor"], "rotary_emb_base": c.rope.theta,
        "use_parallel_residual": c.norms.parallel, "attention_bias": True, "tie_word_embeddings": c.tie_embeddings,
        "attention_dropout": c.attention.dropout, "hidden_dropout": 0.0, "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id, "pad_token_id": None,
    }


def _per_head_qkv() -> Fuse:
    """HF's ``query_key_value``: for each head h its q, k, v rows, [q_h, k_h, v_h], h after h."""
    def split(t: torch.Tensor, c: DecoderConfig) -> list[torch.Tensor]:
        heads = t.view(c.n_heads, 3, c.head_dim, *t.shape[1:])
        return [heads[:, j].reshape(c.n_heads * c.head_dim, *t.shape[1:]) for j in range(3)]

    def join(parts: list[torch.Tensor], c: DecoderConfig) -> torch.Tensor:
        rest = parts[0].shape[1:]
        return torch.stack([p.reshape(c.n_heads, c.head_dim, *rest) for p in parts], 1).reshape(-1, *rest)

    def shapes(s: tuple[int, ...], c: DecoderConfig) -> list[tuple[int, ...]]:
        if not s or s[0] != 3 * c.n_heads * c.head_dim:
            return [s]  # cannot be split so: the ledger reports the shape
        return [(c.n_heads * c.head_dim, *s[1:])] * 3
    return Fuse("per_head_qkv", split, join, shapes)


PER_HEAD_QKV = _per_head_qkv()
QKV = concat("qkv", lambda c: [c.n_heads * c.head_dim] * 3)  # llama.cpp's attn_qkv: q, then k, then v
_LAYER = [("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"), ("attention.dense", "attn.o"),
          ("mlp.dense_h_to_4h", "mlp.up"), ("mlp.dense_4h_to_h", "mlp.down")]


def hf_keymap(c: DecoderConfig) -> KeyMap:
    head = Tied("embed_out.weight", "tok_emb.weight") if c.tie_embeddings else Map("embed_out.weight", "lm_head.weight")
    return KeyMap("gpt_neox (Hugging Face)", [
        Map("gpt_neox.embed_in.weight", "tok_emb.weight"),
        *(Map(f"gpt_neox.layers.{{i}}.{src}.{p}", f"blocks.{{i}}.{dst}.{p}") for src, dst in _LAYER
          for p in ("weight", "bias")),
        *(Fused(f"gpt_neox.layers.{{i}}.attention.query_key_value.{p}", [f"blocks.{{i}}.attn.{n}.{p}" for n in "qkv"],
                PER_HEAD_QKV) for p in ("weight", "bias")),
        Map("gpt_neox.final_layer_norm.weight", "norm_f.weight"),
        Map("gpt_neox.final_layer_norm.bias", "norm_f.bias"),
        head,
        # buffers older files saved: the causal mask, its fill value, RoPE's frequencies
        Drop("gpt_neox.layers.{i}.attention.bias"), Drop("gpt_neox.layers.{i}.attention.masked_bias"),
        Drop("gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"),
    ])


HF_STEPS = {"token_embedding": "gpt_neox.embed_in", "block.{i}": "gpt_neox.layers.{i}",
            "final_norm": "gpt_neox.final_layer_norm"}
_GGUF_LAYER = [(T.ATTN_NORM, "norm1"), (T.FFN_NORM, "norm2"), (T.ATTN_OUT, "attn.o"), (T.FFN_UP, "mlp.up"),
               (T.FFN_DOWN, "mlp.down")]


def gguf_keymap(c: DecoderConfig) -> KeyMap:
    head = (Tied(gguf_name(T.OUTPUT), "tok_emb.weight") if c.tie_embeddings
            else Map(gguf_name(T.OUTPUT), "lm_head.weight"))
    return KeyMap("gptneox (GGUF)", [
        Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
        *(Map(gguf_name(src, p), f"blocks.{{i}}.{dst}.{p}") for src, dst in _GGUF_LAYER for p in ("weight", "bias")),
        *(Fused(gguf_name(T.ATTN_QKV, p), [f"blocks.{{i}}.attn.{n}.{p}" for n in "qkv"], QKV)
          for p in ("weight", "bias")),
        Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight"),
        Map(gguf_name(T.OUTPUT_NORM, "bias"), "norm_f.bias"),
        head,
    ])


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """llama.cpp's gptneox: its LayerNorm eps, the parallel residual (default on), exact GELU (what llama.cpp's
    gptneox runs, ggml's GELU, is its tanh form: see the family's test)."""
    refuse_experts(f)
    parallel = f.get(Keys.LLM.USE_PARALLEL_RESIDUAL, bool, True)
    return decoder_config_from_gguf(
        f, tensors, "gpt_neox", fused_qkv=True, partial_rotary=True,
        norms=dict(eps=f.get(Keys.Attention.LAYERNORM_EPS, float), kind="layer",
                   place="parallel" if parallel else "pre"),
        mlp=dict(gated=False, act="gelu", bias=True))


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter's keys, in its order; the RoPE base too where it is not llama.cpp's default
    10000 (the converter writes none)."""
    _check(c, "llama.cpp's gptneox")
    if c.mlp.act != "gelu":
        raise GptconvError("a gptneox GGUF names no activation and is read as exact GELU (Pythia's): "
                           "hidden_act gelu_new would be read back as another model; not exported")
    w.add_context_length(c.context_length)
    w.add_embedding_length(c.d_model)
    w.add_block_count(c.n_layers)
    w.add_feed_forward_length(c.d_ff)
    w.add_rope_dimension_count(c.rope.dim or c.head_dim)
    w.add_head_count(c.n_heads)
    w.add_parallel_residual(c.norms.parallel)
    w.add_layer_norm_eps(c.norms.eps)
    if c.rope.theta != Rotary().theta:
        w.add_rope_freq_base(c.rope.theta)


FAMILY = Family(
    name="gpt_neox", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("gpt_neox",), config_from_hf=config_from_hf, config_to_hf=config_to_hf, hf_keymap=hf_keymap,
    gguf_arch="gptneox", config_from_gguf=config_from_gguf, gguf_keymap=gguf_keymap, gguf_metadata=gguf_metadata,
    hf_steps=HF_STEPS, describe=describe_decoder,
)
