"""Mixtral (HF mixtral; GGUF llama with experts): the decoder with routed experts for the MLP
(``layers/mlp.py`` MoE: a router picks 2 of 8 SwiGLU experts per token).

HF files store an expert per tensor (``block_sparse_moe.experts.{j}.w1``); transformers 5's module holds
them fused, and saves them so with save_original_format=False: both layouts are read. llama.cpp stacks a
layer's experts in one tensor per matrix and keeps the router in F32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import Keys

from ..convert.gguf_decoder import (EXPERTS, add_llama_hparams, decoder_config_from_gguf, decoder_gguf_keymap,
                                    experts_of, standard_layer, window_of)
from ..convert.hf_config import ConfigFields
from ..convert.hf_decoder import decoder_config_from_hf, decoder_config_to_hf, window_on_every_layer
from ..convert.hf_keys import ATTENTION, DECODER_HF_STEPS, NORMS, decoder_hf_keymap, fused_experts
from ..describe import describe_decoder
from ..convert.keymap import KeyMap, Map, Rule
from ..layers.decoder import Decoder, DecoderConfig
from ..layers.mlp import Experts
from ..layers.rope import Rotary
from .base import Family, Preset

if TYPE_CHECKING:
    from ..sources.gguf_file import GGUFFields

PRESETS: dict[str, Preset] = {
    "mixtral-8x7b": Preset(DecoderConfig(vocab_size=32000, context_length=32768, d_model=4096, n_layers=32, n_heads=32,
                                       n_kv_heads=8, d_ff=14336, rope=Rotary(theta=1000000.0), experts=Experts(8, 2),
                                       bos_token_id=1, eos_token_id=2, family="mixtral"),
                           "mistralai/Mixtral-8x7B-v0.1"),
}


def config_from_hf(data: dict[str, Any], origin: object) -> DecoderConfig:
    f = ConfigFields(data, origin)
    experts = Experts(f.int("num_local_experts"), f.int("num_experts_per_tok"))
    return decoder_config_from_hf(f, "mixtral", {"rms_norm_eps": 1e-5, "rope_theta": 1e6},
                                  window=window_on_every_layer(f, None), experts=experts)


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    """As transformers writes Mixtral's config: no head_dim unless it is not d / heads."""
    out = decoder_config_to_hf(c, "mixtral", "MixtralForCausalLM", experts=True)
    out.update(num_local_experts=c.experts.count, num_experts_per_tok=c.experts.used)
    if c.head_dim == c.d_model // c.n_heads:
        out["head_dim"] = None
    return out


# the router and each expert's SwiGLU (w1 gate, w3 up, w2 down), as the files store them
_MOE = [("block_sparse_moe.gate.weight", "mlp.router.weight"),
        ("block_sparse_moe.experts.{j}.w1.weight", "mlp.experts.{j}.gate.weight"),
        ("block_sparse_moe.experts.{j}.w3.weight", "mlp.experts.{j}.up.weight"),
        ("block_sparse_moe.experts.{j}.w2.weight", "mlp.experts.{j}.down.weight")]


def _moe_fused(config: DecoderConfig) -> list[Rule]:
    """The experts as transformers 5's module holds them: the router under mlp.gate, two 3-D tensors."""
    return [Map("model.layers.{i}.mlp.gate.weight", "blocks.{i}.mlp.router.weight"), *fused_experts(config)]


def hf_keymap(c: DecoderConfig, module: bool = False) -> KeyMap:
    """Both layouts; ``module``: the module's first, so that the inverse (``state_dict(..., "hf")``) gives
    what ``MixtralForCausalLM.load_state_dict`` takes."""
    return decoder_hf_keymap(c, "mixtral", NORMS + ATTENTION + _MOE, _moe_fused(c), fused_first=module)


def config_from_gguf(f: GGUFFields, tensors: dict) -> DecoderConfig:
    return decoder_config_from_gguf(f, tensors, "mixtral", window=window_of(f), **experts_of(f))


FAMILY = Family(
    name="mixtral", config_class=DecoderConfig, model_class=Decoder, presets=PRESETS,
    hf_model_types=("mixtral",), config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    hf_keymap=hf_keymap, hf_module_keymap=lambda c: hf_keymap(c, module=True),
    gguf_arch="llama", config_from_gguf=config_from_gguf,
    gguf_keymap=lambda c: decoder_gguf_keymap(c, "llama", standard_layer(permuted=True, mlp=False) + EXPERTS),
    gguf_metadata=lambda w, c: add_llama_hparams(w, c, key_length_always=False),
    claims_gguf=lambda f: bool(f.get(Keys.LLM.EXPERT_COUNT, int, 0)),  # a llama file with experts
    hf_steps=DECODER_HF_STEPS, describe=describe_decoder,
    gguf_vocab={"add_prefix_space_from_config": True},
)
