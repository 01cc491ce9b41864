"""The record a family file fills in: everything gptconv does that depends on the family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from ..convert.keymap import KeyMap, TensorInfo


@dataclass(frozen=True)
class Preset:
    """A published model: its config (sizes checked against the published parameter count) and the
    Hub repo that holds its weights (what ``gptconv pull NAME`` fetches)."""

    config: Any
    repo: str


@dataclass(frozen=True)
class Wrapper:
    """A multimodal checkpoint whose text model is one of this family's: its config.json's ``model_type``,
    the ``text_config`` types it may hold, where its text weights are (``text_prefixes``: the wrapper's
    prefix → the text model's), and what is left out of the text model (``left_out``: prefixes, named
    in every summary as ``left_out_what``). verify's reference is transformers' whole model, read by
    its own code, on text only: its text model's modules are under ``module_prefix``."""

    model_type: str
    text_types: tuple[str, ...]
    left_out: tuple[str, ...]
    left_out_what: str = "the vision tower and the projector"
    # transformers 5 holds the text model under model.language_model (and saves some wrappers so); older
    # files, and transformers 5's saving of Gemma 3 and Mistral 3, put it under language_model.model
    text_prefixes: tuple[tuple[str, str], ...] = (
        ("model.language_model.", "model."), ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."))
    module_prefix: str = "model.language_model."  # where transformers' model holds the text model's "model."

    def text_name(self, name: str) -> str | None:
        """The text model's name for a tensor of the wrapper, or None where it is no text weight."""
        for prefix, text in self.text_prefixes:
            if name.startswith(prefix):
                return text + name[len(prefix):]
        return None

    def leaves_out(self, name: str) -> bool:
        return name.startswith(self.left_out)


@dataclass(frozen=True)
class Family:
    """One family: its model code, its names in each format, and the functions between them.

    ``name`` is the family's name in gptconv (a config's ``family``), and the HF ``model_type`` its HF
    export writes; ``hf_model_types`` are those it reads. ``gguf_arch`` is llama.cpp's architecture
    for it; where several families share one (llama.cpp's ``llama``: Llama, Mistral, Mixtral),
    ``claims_gguf`` tells from the file's metadata which family a file is."""

    name: str
    config_class: type
    model_class: type[nn.Module]
    presets: dict[str, Preset]
    # Hugging Face: config.json ⇄ config, and the key table for a config
    hf_model_types: tuple[str, ...]
    config_from_hf: Callable[[dict[str, Any], object], Any]
    config_to_hf: Callable[[Any], dict[str, Any]]
    hf_keymap: Callable[[Any], KeyMap]
    # GGUF (llama.cpp): metadata + tensors → config, the key table, and the metadata to write
    gguf_arch: str
    config_from_gguf: Callable[[Any, dict[str, TensorInfo]], Any]
    gguf_keymap: Callable[[Any], KeyMap]
    gguf_metadata: Callable[[Any, Any], None]  # (GGUFWriter, config): the keys llama.cpp's converter writes
    claims_gguf: Callable[[Any], bool] = lambda fields: True
    # tensors a GGUF holds that the config computes (Gemma 4's rope_freqs), beside RoPE scaling's factors
    gguf_tensors: Callable[[Any], list] = lambda config: []
    # the config refined by the file's tensor names, where config.json cannot say (the MTP layers a file holds)
    config_from_hf_tensors: Callable[[Any, Any], Any] = lambda config, names: config
    # the names transformers' model class holds in memory, where they differ from its files' (experts fused)
    hf_module_keymap: Callable[[Any], KeyMap] | None = None
    # the (model_type, class) transformers' GGUF loader reads this family's files as, where not its own
    transformers_reads_gguf_as: tuple[str, str] | None = None
    # our step → transformers' module whose output it is, for verify's per-step comparison
    hf_steps: dict[str, str] = field(default_factory=dict)
    # one line for ``trace``: how position enters and what else this family does
    describe: Callable[[Any], list[str]] = lambda config: []
    # GGUF tokenizer rules of llama.cpp's converter for this family (``convert/hf_vocab.py``)
    gguf_vocab: dict[str, Any] = field(default_factory=dict)
    # the multimodal checkpoints whose text model is of this family
    wrappers: tuple[Wrapper, ...] = ()

    def build(self, config: Any) -> nn.Module:
        return self.model_class(config)

