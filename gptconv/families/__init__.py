"""The families gptconv reads and writes: one file each, listed here, and the lookups the rest of
gptconv uses instead of testing a family's name.

A family file holds its config dataclass (or uses the shared decoder's), its presets with their Hub
repos, its model where its steps differ from the shared parts (``gptconv/layers/``), its HF config
parser and writer, its HF key table, its GGUF parser, metadata writer and key table, and one
``FAMILY = Family(...)`` record (``base.py``). Adding a family is one new file and one line below
(``docs/adding-a-family.md`` is the checklist); a family of your own, outside this package, is
``register(FAMILY)``.
"""

from __future__ import annotations

from typing import Any

from ..errors import GptconvError, where
from . import (deepseek_v3, ernie4_5, exaone4, gemma2, gemma3, gemma4, glm4_moe, glm4_moe_lite, gpt2, gpt_neox, gpt_oss, granite, lfm2, llama, mistral, mixtral, olmo2, phi3, qwen2,
               qwen3, qwen3_5, qwen3_5_moe, qwen3_moe, qwen3_next, smollm3)
from .base import Family, Preset, Wrapper

FAMILIES: tuple[Family, ...] = (
    gpt2.FAMILY,
    llama.FAMILY,
    mistral.FAMILY,
    mixtral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    phi3.FAMILY,
    gemma3.FAMILY,
    olmo2.FAMILY,
    exaone4.FAMILY,
    gemma2.FAMILY,
    ernie4_5.FAMILY,
    qwen3_moe.FAMILY,
    qwen3_5.FAMILY,
    qwen3_5_moe.FAMILY,
    qwen3_next.FAMILY,
    granite.FAMILY,
    smollm3.FAMILY,
    lfm2.FAMILY,
    gemma4.FAMILY,
    gpt_oss.FAMILY,
    deepseek_v3.FAMILY,
    glm4_moe_lite.FAMILY,
    glm4_moe.FAMILY,
    gpt_neox.FAMILY,
)

BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
BY_HF_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.hf_model_types}
# a multimodal checkpoint's model_type → (the family of its text model, the wrapper's layout)
BY_WRAPPER: dict[str, tuple[Family, Wrapper]] = {w.model_type: (f, w) for f in FAMILIES for w in f.wrappers}
# llama.cpp's architecture → the families written as it (llama: Llama, Mistral, Mixtral)
BY_GGUF_ARCH: dict[str, tuple[Family, ...]] = {a: tuple(f for f in FAMILIES if f.gguf_arch == a)
                                               for a in dict.fromkeys(f.gguf_arch for f in FAMILIES)}
PRESETS: dict[str, Preset] = {name: p for f in FAMILIES for name, p in f.presets.items()}


def register(family: Family) -> None:
    """Add ``family`` to the lookups, as if it were listed above (a family file of your own, outside this
    package): it is then read, traced, verified and exported like the others. A name, HF model_type,
    wrapper or preset already taken is refused (``gptconv.models.PRESETS`` lists the families above only)."""
    taken = [what for what, clash in (
        (f"family '{family.name}'", family.name in BY_NAME),
        *((f"model_type '{t}'", t in BY_HF_TYPE or t in BY_WRAPPER) for t in family.hf_model_types),
        *((f"wrapper '{w.model_type}'", w.model_type in BY_WRAPPER or w.model_type in BY_HF_TYPE)
          for w in family.wrappers),
        *((f"preset '{p}'", p in PRESETS) for p in family.presets)) if clash]
    if taken:
        raise GptconvError(f"cannot register family '{family.name}': {', '.join(taken)} already taken")
    global FAMILIES
    FAMILIES = (*FAMILIES, family)
    BY_NAME[family.name] = family
    BY_HF_TYPE.update({t: family for t in family.hf_model_types})
    BY_WRAPPER.update({w.model_type: (family, w) for w in family.wrappers})
    BY_GGUF_ARCH[family.gguf_arch] = (*BY_GGUF_ARCH.get(family.gguf_arch, ()), family)
    PRESETS.update(family.presets)


def family_of(config: Any) -> Family:
    """The family a config of ours belongs to (its ``family``)."""
    return BY_NAME[config.family]


def for_hf(model_type: str, origin: object) -> Family:
    """The family that reads an HF config.json of ``model_type``; ``origin``: the file, for the error."""
    if model_type not in BY_HF_TYPE:
        raise GptconvError(f"{origin}: model_type '{model_type}' is not supported "
                           f"(supported: {', '.join([*BY_HF_TYPE, *BY_WRAPPER])})")
    return BY_HF_TYPE[model_type]


def for_gguf(fields: Any) -> Family:
    """The family of a GGUF file, from its architecture (and, where families share one, its metadata)."""
    arch = fields.arch
    if arch not in BY_GGUF_ARCH:
        raise GptconvError(f"{fields.path}: GGUF architecture '{arch}' is not supported "
                           f"(supported: {', '.join(BY_GGUF_ARCH)})")
    claiming = [f for f in BY_GGUF_ARCH[arch] if f.claims_gguf(fields)]
    if len(claiming) != 1:  # the claims of one architecture's families exclude each other
        raise where(fields.path, f"GGUF architecture '{arch}': {len(claiming)} families claim this file")
    return claiming[0]


__all__ = ["BY_GGUF_ARCH", "BY_HF_TYPE", "BY_WRAPPER", "FAMILIES", "Family", "PRESETS", "Preset", "Wrapper",
           "family_of", "for_gguf", "for_hf", "register"]
