"""GPT-2 (HF gpt2; GGUF gpt2): config.json and GGUF metadata → GPT2Config, and the key maps of both formats."""

from __future__ import annotations

from typing import Any

from gguf import Keys

from ..models.gpt2 import GPT2Config
from .gguf_meta import T, gguf_config, gguf_name
from .hf_config import ConfigFields, build_config
from .keymap import TRANSPOSE, Drop, KeyMap, Map, TensorInfo, Tied

# HF activation_function → torch's F.gelu(approximate=...)
_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


def gpt2_config_from_hf(data: dict[str, Any], origin: object) -> GPT2Config:
    f = ConfigFields(data, origin)
    activation = f.str("activation_function", "gelu_new")
    if activation not in _GELU:
        raise f.error(f"activation_function {activation!r} is not supported (only {', '.join(_GELU)})")
    f.refuse("add_cross_attention", True, "cross-attention")
    f.refuse("scale_attn_weights", False, "unscaled attention")
    f.refuse("scale_attn_by_inverse_layer_idx", True, "attention scaled by layer index")
    f.refuse("reorder_and_upcast_attn", True, "reordered, upcast attention")
    f.refuse("tie_word_embeddings", False, "an LM head untied from the embedding")
    d = f.int("n_embd")
    return build_config(
        GPT2Config, f,
        **f.common(context_length="n_positions", d_model="n_embd", n_layers="n_layer", n_heads="n_head"),
        d_ff=f.positive("n_inner", 4 * d),  # absent or null: 4d; 0 is refused, as transformers would build 0
        norm_eps=f.float("layer_norm_epsilon", 1e-5),
        gelu=_GELU[activation],
        embd_dropout=f.float("embd_pdrop", 0.1),
        attn_dropout=f.float("attn_pdrop", 0.1),
        resid_dropout=f.float("resid_pdrop", 0.1),
    )


def gpt2_config_to_hf(c: GPT2Config) -> dict[str, Any]:
    """The config.json transformers needs to build GPT2LMHeadModel for ``c``."""
    gelu = {"tanh": "gelu_new", "none": "gelu"}[c.gelu]
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": c.vocab_size, "n_positions": c.context_length, "n_embd": c.d_model,
        "n_layer": c.n_layers, "n_head": c.n_heads, "n_inner": c.d_ff, "layer_norm_epsilon": c.norm_eps,
        "activation_function": gelu, "embd_pdrop": c.embd_dropout, "attn_pdrop": c.attn_dropout,
        "resid_pdrop": c.resid_dropout, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
        "tie_word_embeddings": True,
    }


GPT2_HF = KeyMap(
    "gpt2 (Hugging Face)",
    [
        Map("transformer.wte.weight", "tok_emb.weight"),
        Map("transformer.wpe.weight", "pos_emb.weight"),
        Map("transformer.h.{i}.ln_1.weight", "blocks.{i}.norm1.weight"),
        Map("transformer.h.{i}.ln_1.bias", "blocks.{i}.norm1.bias"),
        Map("transformer.h.{i}.attn.c_attn.weight", "blocks.{i}.attn.qkv.weight", TRANSPOSE),
        Map("transformer.h.{i}.attn.c_attn.bias", "blocks.{i}.attn.qkv.bias"),
        Map("transformer.h.{i}.attn.c_proj.weight", "blocks.{i}.attn.proj.weight", TRANSPOSE),
        Map("transformer.h.{i}.attn.c_proj.bias", "blocks.{i}.attn.proj.bias"),
        Map("transformer.h.{i}.ln_2.weight", "blocks.{i}.norm2.weight"),
        Map("transformer.h.{i}.ln_2.bias", "blocks.{i}.norm2.bias"),
        Map("transformer.h.{i}.mlp.c_fc.weight", "blocks.{i}.mlp.fc.weight", TRANSPOSE),
        Map("transformer.h.{i}.mlp.c_fc.bias", "blocks.{i}.mlp.fc.bias"),
        Map("transformer.h.{i}.mlp.c_proj.weight", "blocks.{i}.mlp.proj.weight", TRANSPOSE),
        Map("transformer.h.{i}.mlp.c_proj.bias", "blocks.{i}.mlp.proj.bias"),
        Map("transformer.ln_f.weight", "norm_f.weight"),
        Map("transformer.ln_f.bias", "norm_f.bias"),
        # The causal mask older transformers saved as buffers: we build ours from the shapes.
        Drop("transformer.h.{i}.attn.bias"),
        Drop("transformer.h.{i}.attn.masked_bias"),
        # GPT-2's head is the embedding; some files store it a second time.
        Tied("lm_head.weight", "tok_emb.weight"),
    ],
    legacy_prefix="transformer.",
)


# ---------------------------------------------------------------------------------------------------
# GGUF (llama.cpp)

def gpt2_config_from_gguf(f: Any, tensors: dict[str, TensorInfo]) -> GPT2Config:
    d = f.get(Keys.LLM.EMBEDDING_LENGTH, int)
    return gguf_config(GPT2Config, f, tensors, d_ff=f.get(Keys.LLM.FEED_FORWARD_LENGTH, int, 4 * d),
                       norm_eps=f.get(Keys.Attention.LAYERNORM_EPS, float))


_GPT2_GGUF_LAYER = [(T.ATTN_NORM, "norm1"), (T.ATTN_QKV, "attn.qkv"), (T.ATTN_OUT, "attn.proj"),
                    (T.FFN_NORM, "norm2"), (T.FFN_UP, "mlp.fc"), (T.FFN_DOWN, "mlp.proj")]

# llama.cpp stores GPT-2's weights (out, in) already, so nothing is transposed.
GPT2_GGUF = KeyMap("gpt2 (GGUF)", [
    Map(gguf_name(T.TOKEN_EMBD), "tok_emb.weight"),
    Map(gguf_name(T.POS_EMBD), "pos_emb.weight"),
    *(Map(gguf_name(src, p), f"blocks.{{i}}.{dst}.{p}") for src, dst in _GPT2_GGUF_LAYER for p in ("weight", "bias")),
    Map(gguf_name(T.OUTPUT_NORM), "norm_f.weight"),
    Map(gguf_name(T.OUTPUT_NORM, "bias"), "norm_f.bias"),
    Tied(gguf_name(T.OUTPUT), "tok_emb.weight"),
])
