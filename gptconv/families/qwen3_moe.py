"""Qwen3-MoE (HF qwen3_moe; GGUF qwen3moe): Qwen3's decoder (an RMSNorm on each head of q and k before
RoPE) with routed experts for the MLP: a router picks ``num_experts_per_tok`` of ``num_experts`` SwiGLU
experts of ``moe_intermediate_size`` per token, their softmax weights renormalised or not
(``norm_topk_prob``). Layers listed in ``mlp_only_layers``, or off the ``decoder_sparse_step``, keep a
dense SwiGLU of ``intermediate_size``.

HF files store an expert per tensor (``mlp.experts.{j}.gate_proj``); transformers 5's module holds them
fused, and saves them so with save_original_format=False: both layouts are read. llama.cpp's qwen3moe
rotates halves as HF does (no Q/K permutation), stacks a layer's experts in one tensor per matrix, keeps
the router in F32, renormalises the chosen weights always and has experts on every layer: a config
with dense layers or unnormalised weights is not exported to GGUF.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import Keys

from ..convert.gguf_decoder import (EXPERTS, QK_NORM as GGUF_QK_NORM, add_decoder_hparams, add_key_length,
                                    add_linear_scaling, add_window, decoder_config_from_gguf, decoder_gguf_keymap,
                                    experts_of, standard_layer)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, experts_from_hf, no_window
from ..convert.hf_keys import (ATTENTION, DECODER_HF_STEPS, EXPERT_ROWS, MLP, NORMS, QK_NORM, decoder_hf_keymap,
                               fused_experts)
from ..describe import describe_decoder
from ..convert.keymap import KeyMap
from ..errors import where
from ..layers.decoder import Feature, Decoder, DecoderConfig
from ..layers.mlp import Experts
from ..layers.rope import Rotary
from ..layers.norms import Norms
from ..layers.attention import AttentionOptions
from .base import Family, Preset

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from ..sources.gguf_file import GGUFFields

PRESETS: dict[str, Preset] = {
    # Qwen/Qwen3-30B-A3B: 48 layers of 2048, 128 experts of 768 (8 per token, renormalised), untied
    "qwen3-30b-a3b": Preset(DecoderConfig(vocab_size=151936, context_length=40960, d_model=2048, n_layers=48,
                                        n_heads=32, n_kv_heads=4, d_ff=6144, head_dim=128, norms=Norms(eps=1e-6),
                                        rope=Rotary(theta=1000000.0), attention=AttentionOptions(qk_norm=True),
                                        experts=Experts(128, 8, d_ff=768), bos_token_id=151643, eos_token_id=151645,
                                        family="qwen3_moe"), "Qwen/Qwen3-30B-A3B"),
}

_HAS = frozenset({Feature.UNNORMALISED_EXPERTS, Feature.EXPERT_SIZE, Feature.DENSE_AMONG_EXPERTS})


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    bias = f.bool("attention_bias", False)
    if f.bool("use_sliding_window", False):  # transformers' qwen3_moe: the window on every layer
        window = f.positive("sliding_window", 4096)
    else:
        no_window(f)
        window = None
    return decoder_config_from_hf(f, "qwen3_moe", {}, attention=dict(qkv_bias=bias, o_bias=bias, qk_norm=True),
                                  window=window, **experts_from_hf(f))


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    out = decoder_config_to_hf(c, "qwen3_moe", "Qwen3MoeForCausalLM", biases=(c.attention.qkv_bias, c.attention.qkv_bias, False),
                               qk_norm=True, experts=True, has=_HAS)
    e = c.experts
    out.update(num_experts=e.count, num_experts_per_tok=e.used, moe_intermediate_size=e.d_ff or c.d_ff,
               norm_topk_prob=e.renormalise, decoder_sparse_step=1,
               mlp_only_layers=[i for i in range(c.n_layers) if not c.experts_at(i)],
               use_sliding_window=c.attention.window is not None)
    return out


def hf_keymap(c: DecoderConfig, module: bool = False) -> KeyMap:
    """Both layouts of the experts, and the dense layers' MLP; ``module``: the module's layout first, so
    that the inverse gives what ``Qwen3MoeForCausalLM.load_state_dict`` takes."""
    return decoder_hf_keymap(c, "qwen3_moe", NORMS + ATTENTION + QK_NORM + MLP + EXPERT_ROWS, fused_experts(c),
                             fused_first=module)


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    """llama.cpp's qwen3moe: experts on every layer, their weights renormalised (it says so in its code, not
    the file), no window, no shared expert."""
    experts = experts_of(f, renormalise=True, d_ff=f.get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int))
    if not experts:
        raise where(f.path, "qwen3moe without expert_count")
    for key in (Keys.Attention.SLIDING_WINDOW, Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH):
        if f.get(key, int, 0):
            raise where(f.path, f"'{key.format(arch=f.arch)}' is not supported: llama.cpp's qwen3moe has no such "
                                "feature")
    return decoder_config_from_gguf(f, tensors, "qwen3_moe", attention=dict(qk_norm=True), **experts)


def gguf_metadata(w: GGUFWriter, c: DecoderConfig) -> None:
    """llama.cpp's converter: the generic keys, the key length, and the experts' size."""
    add_decoder_hparams(w, c, has=frozenset({Feature.EXPERT_SIZE}), arch="qwen3moe")
    add_window(w, c, "qwen3moe", kept=False)
    add_key_length(w, c, always=True)
    add_linear_scaling(w, c)
    w.add_expert_feed_forward_length(c.experts.d_ff or c.d_ff)


FAMILY = Family(
    name="qwen3_moe", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("qwen3_moe",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=hf_keymap, hf_module_keymap=lambda c: hf_keymap(c, module=True),
    gguf_arch="qwen3moe", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "qwen3moe",
                                              standard_layer(permuted=False, mlp=False) + GGUF_QK_NORM + EXPERTS),
    gguf_metadata=gguf_metadata,
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"pre_tokenizer_first": "qwen2"},
)
