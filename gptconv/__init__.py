"""gptconv: pretrained GPT-2 and Llama weights in clean PyTorch code, proven right.

>>> import gptconv
>>> model = gptconv.load("gpt2")          # our nn.Module, with .config
>>> tok = gptconv.load_tokenizer("gpt2")
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import GptconvError
from .loader import load, open_source
from .models import GPT2, KVCache, GPT2Config


def load_tokenizer(source: str):
    """The checkpoint's own tokenizer (``tokenizers`` library): ids equal to transformers' for an HF
    folder, to llama.cpp's for a GGUF file (a vocabulary-only GGUF file of any architecture too)."""
    from pathlib import Path
    if str(source).endswith(".gguf") and Path(source).is_file():
        from .sources.gguf_file import read_fields
        from .tokenizer import gguf_tokenizer
        return gguf_tokenizer(read_fields(Path(source)))
    from .tokenizer import load_tokenizer as _load
    return _load(open_source(source))


__all__ = ["GPT2", "GPT2Config", "GptconvError", "KVCache", "load", "load_tokenizer", "open_source"]
