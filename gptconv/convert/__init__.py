"""Converters: checkpoints in other people's layouts → our models (and back, for export).

- ``keymap``: the generic key-mapping engine and its ledger;
- ``hf_config``: typed reading of config.json; ``gguf_meta``: llama.cpp's tensor names and the
  metadata every GGUF config is built from;
- the shared decoder in each format, which the family files (``gptconv/families/``) build their
  tables from: ``hf_decoder`` (config.json both ways), ``hf_rope`` (its RoPE fields), ``hf_keys`` (the
  weights' and steps' HF names); ``gguf_decoder`` (metadata, tensor rows, llama.cpp's Q/K permutation);
- ``spm``, ``gguf_tokenizer``, ``hf_vocab``: tokenizer formats (SentencePiece, GGUF, an HF folder's
  tokenizer as llama.cpp's converter writes it).

Files are read in ``gptconv.sources``; each family's tables are in its file under ``gptconv.families``.
"""

from __future__ import annotations

from .keymap import KeyMap, Plan, TensorInfo, model_shapes

__all__ = ["KeyMap", "Plan", "TensorInfo", "model_shapes"]
