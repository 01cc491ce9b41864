"""GPT-2 (HF gpt2; GGUF gpt2): learned positions, LayerNorm, GELU MLP, multi-head attention, tied LM head.

The config, the published sizes, the model (its own forward: GPT-2 is the one family with learned
positions, fused q/k/v with biases and an ungated MLP), and its formats: config.json and GGUF
metadata ⇄ GPT2Config, and the key tables of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from gguf import Keys

from ..convert.gguf_meta import T, gguf_config, gguf_name
from ..convert.hf_config import ConfigFields, build_config
from ..convert.keymap import TRANSPOSE, Drop, KeyMap, Map, TensorInfo, Tied
from ..layers.attention import causal_attention
from ..layers.config_checks import MAX_LAYERS, check_range, check_sizes
from ..layers.kv_cache import KVCache, LayerKV
from ..layers.linear import Linear, linear
from ..layers.step import Step
from ..layers.tap import Tap, no_tap
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    context_length: int = 1024  # HF: n_positions, the rows of the position embedding
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072  # HF: n_inner (None there means 4 · d_model)
    norm_eps: float = 1e-5
    gelu: str = "tanh"  # "tanh" (HF gelu_new, GPT-2's own) or "none" (exact erf GELU)
    embd_dropout: float = 0.1
    attn_dropout: float = 0.1
    resid_dropout: float = 0.1
    bos_token_id: int | None = 50256
    eos_token_id: int | None = 50256

    arch = "gpt2"
    family = "gpt2"

    def __post_init__(self) -> None:
        check_sizes(self, {"vocab_size": 10_000_000, "context_length": 1 << 24, "d_model": 1 << 16,
                           "n_layers": MAX_LAYERS, "n_heads": 1024, "d_ff": 1 << 20})
        check_range(self, ("embd_dropout", "attn_dropout", "resid_dropout"), 0.0, 1.0)
        check_range(self, ("norm_eps",), 0.0, 1.0, low_open=True)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model = {self.d_model} is not a multiple of n_heads = {self.n_heads}")
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"gelu = {self.gelu!r}: only 'tanh' and 'none' exist")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_kv_heads(self) -> int:  # GPT-2 has one K/V head per query head
        return self.n_heads


# The published models (config.json of each repository)
PRESETS: dict[str, Preset] = {
    "gpt2": Preset(GPT2Config(), "openai-community/gpt2"),
    "gpt2-medium": Preset(GPT2Config(d_model=1024, n_layers=24, n_heads=16, d_ff=4096), "openai-community/gpt2-medium"),
    "gpt2-large": Preset(GPT2Config(d_model=1280, n_layers=36, n_heads=20, d_ff=5120), "openai-community/gpt2-large"),
    "gpt2-xl": Preset(GPT2Config(d_model=1600, n_layers=48, n_heads=25, d_ff=6400), "openai-community/gpt2-xl"),
    "distilgpt2": Preset(GPT2Config(n_layers=6), "distilbert/distilgpt2"),
}


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.context_length, config.d_model)
        self.drop = nn.Dropout(config.embd_dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm_f = nn.LayerNorm(config.d_model, eps=config.norm_eps)

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None, last_only: bool = False, tap: Tap = no_tap,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids (B, T) → logits (B, T, V), or (B, 1, V) with ``last_only``. ``attention_mask``
        (B, T), 0 at pad tokens (left or right): each sequence gets the logits it gets alone."""
        step = Step.begin(ids, cache, attention_mask, tap, self.config.context_length)
        x = self.tok_emb(ids)                                       # (B, T, d)
        tap("token_embedding", x)
        x = x + self.pos_emb(step.positions)                        # (B, T, d): learned positions
        tap("position_embedding", x)
        x = self.drop(x)
        tap("embedding_dropout", x)
        for i, block in enumerate(self.blocks):
            x = block(x, step.at(i))                                # (B, T, d)
            tap(f"block.{i}", x)
        if last_only:
            x = x[:, -1:]                                           # (B, 1, d): only the next token matters
        x = self.norm_f(x)                                          # (B, T, d)
        tap("final_norm", x)
        logits = linear(x, self.tok_emb.weight)                     # (B, T, V): tied head, x @ wteᵀ
        tap("logits", logits)
        return logits


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.attn = SelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), step)
        return x + self.mlp(self.norm2(x))


class SelfAttention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.qkv = Linear(config.d_model, 3 * config.d_model)  # q, k, v fused, as GPT-2 stores them
        self.proj = Linear(config.d_model, config.d_model)
        self.attn_dropout = config.attn_dropout
        self.resid_drop = nn.Dropout(config.resid_dropout)

    def make_state(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device,
                   reserve: int | None) -> LayerKV:
        """This layer's slot in the cache: its keys and values (one K/V head per query head)."""
        return LayerKV(batch, self.n_heads, self.head_dim, max_len, dtype, device, reserve)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)                      # 3 × (B, T, d)
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, h, T, hd)
        if step.cache is not None:
            k, v = step.cache.update(step.layer, k, v)              # (B, h, past + T, hd)
        past = k.size(2) - T
        p = self.attn_dropout if self.training else 0.0
        y = causal_attention(q, k, v, past, dropout_p=p, padding=step.pad)  # (B, h, T, hd)
        y = y.transpose(1, 2).reshape(B, T, d)                      # (B, T, d)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.fc = Linear(config.d_model, config.d_ff)
        self.proj = Linear(config.d_ff, config.d_model)
        self.approximate = config.gelu
        self.drop = nn.Dropout(config.resid_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))  # d → d_ff → d


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

def gpt2_config_from_gguf(f: GGUFFields, tensors: dict[str, TensorInfo]) -> GPT2Config:
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


def gpt2_gguf_metadata(w: GGUFWriter, c: GPT2Config) -> None:
    """The hyperparameters llama.cpp's converter writes for gpt2, in its order."""
    w.add_context_length(c.context_length)
    w.add_embedding_length(c.d_model)
    w.add_feed_forward_length(c.d_ff)
    w.add_block_count(c.n_layers)
    w.add_head_count(c.n_heads)
    w.add_layer_norm_eps(c.norm_eps)


FAMILY = Family(
    name="gpt2", config_class=GPT2Config, model_class=GPT2, presets=PRESETS,
    hf_model_types=("gpt2",), config_from_hf=gpt2_config_from_hf, config_to_hf=gpt2_config_to_hf,
    hf_keymap=lambda config: GPT2_HF,
    gguf_arch="gpt2", config_from_gguf=gpt2_config_from_gguf, gguf_keymap=lambda config: GPT2_GGUF,
    gguf_metadata=gpt2_gguf_metadata,
    hf_steps={"embedding_dropout": "transformer.drop", "block.{i}": "transformer.h.{i}",
              "final_norm": "transformer.ln_f"},
)
