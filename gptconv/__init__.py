"""gptconv: pretrained GPT-2 and Llama weights in clean PyTorch code, proven right.

One function per command, each returning a typed result with ``to_dict()``:

>>> import gptconv
>>> model = gptconv.load("gpt2")                      # our nn.Module, with .config
>>> tok = gptconv.load_tokenizer("gpt2")
>>> gptconv.pull("gpt2")                              # PullSummary
>>> gptconv.trace("gpt2", "The capital of France is")  # Trace: every step, the next token
>>> gptconv.generate("gpt2", "Hello", 16)             # Generation
>>> gptconv.verify("gpt2").passed                     # Report, against transformers
>>> gptconv.export("gpt2", "gpt2.gguf", "gguf", "f16")  # ExportSummary
>>> gptconv.inspect("gpt2.gguf")                      # Inspection
"""

from __future__ import annotations

__version__ = "0.1.0"

from pathlib import Path

from .api import (ExportSummary, Generation, Inspection, Perplexity, PullSummary, Report, Trace, export, generate,
                  inspect, perplexity, pull, record_reference, trace, verify)
from .errors import GptconvError
from .layouts import state_dict
from .loader import load, open_source
from .models import GPT2, GPT2Config, KVCache, Decoder, DecoderConfig
from .tokenizer import Tokenizer


def load_tokenizer(source: str | Path) -> Tokenizer:
    """The checkpoint's own tokenizer (``tokenizers`` library): ids equal to transformers' for an HF
    folder, to llama.cpp's for a GGUF file (a vocabulary-only GGUF file of any architecture too)."""
    from .sources.gguf_file import read_fields
    from .tokenizer import gguf_tokenizer
    from .tokenizer import load_tokenizer as _load
    if str(source).endswith(".gguf") and Path(source).is_file():
        return gguf_tokenizer(read_fields(Path(source)))
    return _load(open_source(source))


__all__ = ["GPT2", "GPT2Config", "ExportSummary", "Generation", "GptconvError", "Inspection", "KVCache", "Decoder",
           "DecoderConfig", "Perplexity", "PullSummary", "Report", "Trace", "Tokenizer", "export", "generate", "inspect",
           "load", "load_tokenizer", "open_source", "perplexity", "pull", "record_reference", "state_dict", "trace",
           "verify"]
