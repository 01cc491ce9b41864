"""Hugging Face's names for the decoder's weights and steps (``layers/decoder.py``): the standard layer's
rows (``model.layers.{i}.self_attn.q_proj`` …) and the variants families pick from (q/k norms, norms after
the sublayers, interleaved q/k rows, experts as separate or as fused tensors), the key table they are
assembled into, and the modules verify compares step by step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..layers.decoder import DecoderConfig
from .gguf_decoder import PERMUTE_K, PERMUTE_Q
from .keymap import Drop, Fuse, Fused, KeyMap, Map, Rule, Stacked, Tied
from .mtp import mtp_hf_rows

# our step → transformers' module whose output it is
DECODER_HF_STEPS = {"token_embedding": "model.embed_tokens", "block.{i}": "model.layers.{i}",
                    "final_norm": "model.norm"}

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

    def shapes(s: tuple[int, ...], c: DecoderConfig) -> list[tuple[int, ...]]:
        if len(s) != 3 or s[1] != 2 * size(c):
            return [s]  # cannot be split so: the ledger reports the shape
        return [(size(c), s[2])] * (2 * s[0])
    return Fuse("experts_gate_up", lambda t, c: [p for e in t.unbind(0) for p in e.split(size(c), 0)],
                lambda ts, c: torch.stack([torch.cat(ts[k:k + 2], 0) for k in range(0, len(ts), 2)]), shapes)


# the router and each expert's SwiGLU, as the files store them (the router is mlp.gate in both layouts)
EXPERT_ROWS = [("mlp.gate.weight", "mlp.router.weight"),
               *((f"mlp.experts.{{j}}.{n}_proj.weight", f"mlp.experts.{{j}}.{n}.weight")
                 for n in ("gate", "up", "down"))]


def fused_experts(config: DecoderConfig) -> list[Rule]:
    """A layer's experts as transformers 5's module holds them (Mixtral, Qwen3-MoE), and saves them with
    save_original_format=False: two 3-D tensors under mlp.experts (the router is the family's own row)."""
    experts = range(config.experts.count)
    return [Fused("model.layers.{i}.mlp.experts.gate_up_proj",
                  [f"blocks.{{i}}.mlp.experts.{j}.{w}.weight" for j in experts for w in ("gate", "up")],
                  experts_gate_up(lambda c: c.experts.d_ff or c.d_ff)),
            Stacked("model.layers.{i}.mlp.experts.down_proj", "blocks.{i}.mlp.experts.{j}.down.weight",
                    lambda c: c.experts.count)]


def decoder_hf_keymap(config: DecoderConfig, model_type: str, layer: list[tuple[str, str]], fused: list[Rule] = (),
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
