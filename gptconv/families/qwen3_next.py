"""Qwen3-Next (HF qwen3_next; GGUF qwen3next): the hybrid decoder of Qwen3.5 (``families/qwen3_5.py``:
three linear-attention layers to one gated full-attention layer) with routed experts and a shared
expert in every MLP: a router picks ``num_experts_per_tok`` of ``num_experts`` SwiGLU experts per token
(weights renormalised where ``norm_topk_prob``), and a shared SwiGLU runs on every token, × sigmoid of
its own gate. Layers in ``mlp_only_layers`` or off the ``decoder_sparse_step`` keep a dense SwiGLU.

Its files store the linear layers' projections grouped by key head (``in_proj_qkvz``: per key head its q,
k, v and z rows; ``in_proj_ba``: its b and a rows); Qwen3.5 later split them into in_proj_qkv, in_proj_z,
in_proj_b and in_proj_a, which is how our model holds them. The multi-token-prediction layers (``mtp.*``)
are held, not run (``layers/mtp.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..convert.gguf_hybrid import add_hybrid_hparams, hybrid_config_from_gguf, hybrid_gguf_keymap
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_to_hf, experts_from_hf
from ..convert.hf_keys import DECODER_HF_STEPS, EXPERT_ROWS, MLP, NORMS, decoder_hf_keymap, fused_experts
from ..describe import describe_decoder
from ..convert.mtp import with_hf_mtp_layers
from ..convert.hf_hybrid import (GATED_ATTENTION, GATED_Q, LINEAR_ATTENTION, LINEAR_CONV, QWEN3_NEXT_LINEAR,
                                 SHARED_EXPERT, hybrid_config_from_hf, hybrid_to_hf)
from ..convert.keymap import KeyMap
from ..layers.decoder import FULL, Feature, LINEAR, Decoder, DecoderConfig
from ..layers.linear_attention import DeltaNetShape
from ..layers.mlp import Experts
from ..layers.rope import Rotary
from ..layers.norms import Norms
from ..layers.attention import AttentionOptions
from .base import Family, Preset

if TYPE_CHECKING:
    from ..sources.gguf_file import GGUFFields

PRESETS: dict[str, Preset] = {
    # Qwen/Qwen3-Next-80B-A3B-Instruct: 48 layers of 2048 (3 linear : 1 full), 16 query and 2 K/V heads of 256
    # (RoPE on 64), linear layers of 16 key and 32 value heads of 128; 512 experts of 512, 10 per token, and a
    # shared expert of 512
    "qwen3-next-80b-a3b": Preset(DecoderConfig(vocab_size=151936, context_length=262144, d_model=2048, n_layers=48,
                                             n_heads=16, n_kv_heads=2, d_ff=5120, head_dim=256,
                                             norms=Norms(eps=1e-6, offset=True),
                                             rope=Rotary(theta=10000000.0, dim=64),
                                             attention=AttentionOptions(qk_norm=True, gate=True),
                                             layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(48)),
                                             linear_attention=DeltaNetShape(k_heads=16, v_heads=32, k_dim=128, v_dim=128, conv_kernel=4),
                                             experts=Experts(512, 10, d_ff=512, shared_d_ff=512, renormalise=True),
                                             bos_token_id=151643, eos_token_id=151645, family="qwen3_next"), "Qwen/Qwen3-Next-80B-A3B-Instruct"),
}

HAS = frozenset({Feature.LAYER_TYPES, Feature.LINEAR_ATTENTION, Feature.ATTENTION_GATE, Feature.OFFSET_NORMS, Feature.PARTIAL_ROTARY, Feature.MTP,
                 Feature.SHARED_EXPERT, Feature.EXPERT_SIZE})


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    return hybrid_config_from_hf(f, "qwen3_next",
                                 **experts_from_hf(f, shared_d_ff=f.positive("shared_expert_intermediate_size", 512)))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(c, "qwen3_next", "Qwen3NextForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, False),
                               window=False, qk_norm=True, experts=True,
                               has=HAS | {Feature.UNNORMALISED_EXPERTS, Feature.DENSE_AMONG_EXPERTS})
    e = c.experts
    out.update(num_experts=e.count, num_experts_per_tok=e.used, moe_intermediate_size=e.d_ff or c.d_ff,
               shared_expert_intermediate_size=e.shared_d_ff, norm_topk_prob=e.renormalise,
               decoder_sparse_step=1, mlp_only_layers=[i for i in range(c.n_layers) if not c.experts_at(i)])
    return {**out, **hybrid_to_hf(c)}


def hf_keymap(c: DecoderConfig, module: bool = False) -> KeyMap:
    """The linear layers' projections in Qwen3-Next's grouped layout (transformers' Qwen3Next has no other);
    the experts in both layouts (``module``: the module's first)."""
    rows = NORMS + MLP + GATED_ATTENTION + [r for r in LINEAR_ATTENTION if not r[0].startswith("linear_attn.in_proj")] \
        + EXPERT_ROWS + SHARED_EXPERT
    return decoder_hf_keymap(c, "qwen3_next", rows, [GATED_Q, LINEAR_CONV, *QWEN3_NEXT_LINEAR, *fused_experts(c)],
                             fused_first=module, mtp=True)


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """llama.cpp's qwen3next: experts on every layer, their weights renormalised, a shared expert."""
    from gguf import Keys
    return hybrid_config_from_gguf(f, tensors, "qwen3_next", experts=dict(
        renormalise=True, d_ff=f.get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int),
        shared_d_ff=f.get(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, int)))


FAMILY = Family(
    name="qwen3_next", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("qwen3_next",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=hf_keymap, hf_module_keymap=lambda c: hf_keymap(c, module=True), config_from_hf_tensors=with_hf_mtp_layers,
    gguf_arch="qwen3next", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: hybrid_gguf_keymap(c, "qwen3next", tiled=False),
    gguf_metadata=lambda w, c: add_hybrid_hparams(w, c, "qwen3next", has=HAS),
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"pre_tokenizer_first": "qwen2"},
)
