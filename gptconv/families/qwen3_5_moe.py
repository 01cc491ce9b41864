"""Qwen3.5 / 3.6 MoE (HF qwen3_5_moe_text, and the text model of the multimodal qwen3_5_moe; GGUF
qwen35moe): Qwen3.5's hybrid decoder (``families/qwen3_5.py``) with Qwen3-Next's MLP on every layer:
routed experts, their weights always renormalised, and a shared expert × sigmoid of its gate. Released
files (Qwen3.6-35B-A3B, Qwen3.5-35B-A3B) store each layer's experts fused (transformers 5's layout);
both layouts are read. The multi-token-prediction layers (``mtp.*``) are held, not run (``layers/mtp.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..convert.gguf_hybrid import add_hybrid_hparams, add_mrope_sections, hybrid_config_from_gguf, hybrid_gguf_keymap
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_to_hf
from ..convert.hf_keys import DECODER_HF_STEPS, EXPERT_ROWS, NORMS, decoder_hf_keymap, fused_experts
from ..describe import describe_decoder
from ..convert.mtp import with_hf_mtp_layers
from ..convert.hf_hybrid import (GATED_ATTENTION, GATED_Q, LINEAR_ATTENTION, LINEAR_CONV, SHARED_EXPERT,
                                 hybrid_config_from_hf, hybrid_to_hf)
from ..convert.keymap import KeyMap
from ..layers.decoder import FULL, LINEAR, Decoder, DecoderConfig
from ..layers.linear_attention import DeltaNetShape
from ..layers.mlp import Experts
from ..layers.rope import Rotary
from ..layers.norms import Norms
from ..layers.attention import AttentionOptions
from .base import Family, Preset, Wrapper
from .qwen3_next import HAS

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

PRESETS: dict[str, Preset] = {
    # Qwen/Qwen3.6-35B-A3B: 40 layers of 2048 (3 linear : 1 full), 16 query and 2 K/V heads of 256 (RoPE on 64),
    # linear layers of 16 key and 32 value heads of 128; 256 experts of 512, 8 per token, a shared expert of 512
    "qwen3.6-35b-a3b": Preset(DecoderConfig(vocab_size=248320, context_length=262144, d_model=2048, n_layers=40,
                                          n_heads=16, n_kv_heads=2, d_ff=512, head_dim=256,
                                          norms=Norms(eps=1e-6, offset=True), rope=Rotary(theta=10000000.0, dim=64),
                                          attention=AttentionOptions(qk_norm=True, gate=True),
                                          layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(40)),
                                          linear_attention=DeltaNetShape(k_heads=16, v_heads=32, k_dim=128, v_dim=128, conv_kernel=4),
                                          experts=Experts(256, 8, shared_d_ff=512), eos_token_id=248044,
                                          family="qwen3_5_moe"), "Qwen/Qwen3.6-35B-A3B"),
}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    size = f.positive("moe_intermediate_size", 512)  # every layer routes: the experts' size is the MLP's
    return hybrid_config_from_hf(ConfigFields({**data, "intermediate_size": size}, origin), "qwen3_5_moe",
                                 experts=Experts(f.positive("num_experts", 256), f.positive("num_experts_per_tok", 8),
                                                 shared_d_ff=f.positive("shared_expert_intermediate_size", 512)))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(c, "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, False),
                               window=False, qk_norm=True, experts=True, has=HAS)
    out.pop("intermediate_size")
    e = c.experts
    out.update(num_experts=e.count, num_experts_per_tok=e.used, moe_intermediate_size=e.d_ff or c.d_ff,
               shared_expert_intermediate_size=e.shared_d_ff)
    return {**out, **hybrid_to_hf(c)}


def hf_keymap(c: DecoderConfig, module: bool = False) -> KeyMap:
    """The experts in both layouts (``module``: the module's first, which the inverse then names)."""
    return decoder_hf_keymap(c, "qwen3_5_moe", NORMS + GATED_ATTENTION + LINEAR_ATTENTION + EXPERT_ROWS + SHARED_EXPERT,
                             [GATED_Q, LINEAR_CONV, *fused_experts(c)], fused_first=module, mtp=True)


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """The experts' size is the MLP's: the file has no dense one (no feed_forward_length)."""
    from gguf import Keys
    size = f.get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int)
    return hybrid_config_from_gguf(f, tensors, "qwen3_5_moe", d_ff=size, experts=dict(
        renormalise=True, shared_d_ff=f.get(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, int)))


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    add_hybrid_hparams(w, c, "qwen35moe", has=HAS, feed_forward=False)
    add_mrope_sections(w, c, "qwen35moe")


FAMILY = Family(
    name="qwen3_5_moe", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("qwen3_5_moe_text",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=hf_keymap, hf_module_keymap=lambda c: hf_keymap(c, module=True), config_from_hf_tensors=with_hf_mtp_layers,
    gguf_arch="qwen35moe", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: hybrid_gguf_keymap(c, "qwen35moe", tiled=True), gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"pre_tokenizer_first": "qwen2"},
    wrappers=(Wrapper("qwen3_5_moe", ("qwen3_5_moe_text",), left_out=("model.visual.", "visual."),
                      left_out_what="the vision tower and its mergers"),),
)
