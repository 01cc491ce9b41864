"""What every GGUF architecture shares: llama.cpp's tensor names, from gguf-py's own table
(``gguf.TENSOR_NAMES``), and the metadata every config is built from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gguf import MODEL_TENSOR, TENSOR_NAMES, Keys

from ..errors import where
from .keymap import TensorInfo

if TYPE_CHECKING:
    from ..sources.gguf_file import GGUFFields

T = MODEL_TENSOR


def gguf_name(tensor: MODEL_TENSOR, part: str = "weight") -> str:
    """``blk.{i}.attn_q.weight`` for ``(ATTN_Q, "weight")``: gguf's name, with the key map's ``{i}``."""
    return f"{TENSOR_NAMES[tensor].replace('{bid}', '{i}')}.{part}"


def block_count(f: GGUFFields, tensors: dict[str, TensorInfo], less: int = 0) -> int:
    """The file's block count (``less`` the MTP blocks after the trunk), refused where its tensors hold
    fewer blocks: every layer count a config makes lists of is bounded by the file, not by a field (2^31
    blocks built a tuple for minutes)."""
    n = f.get(Keys.LLM.BLOCK_COUNT, int) - less
    held = 1 + max((int(name.split(".")[1]) for name in tensors
                    if name.startswith("blk.") and name.split(".")[1].isdigit()), default=-1)
    if n > held:
        raise where(f.path, f"{Keys.LLM.BLOCK_COUNT.format(arch=f.arch)} is {n + less:,} but its tensors hold "
                            f"{held:,} blocks")
    return n


def gguf_config(cls: type, f: GGUFFields, tensors: dict[str, TensorInfo], **specific: Any) -> Any:
    """``cls`` from the metadata every architecture has (vocabulary, context, width, depth, heads,
    special ids) and the architecture's ``specific`` fields; a value the config refuses is an error
    naming the file. The vocabulary size is the token list's length where the key is absent (llama.cpp
    writes it for some architectures only), else the embedding's rows."""
    vocab = f.get(Keys.LLM.VOCAB_SIZE, int, 0) or len(f.get(Keys.Tokenizer.LIST, list, []))
    try:
        return cls(vocab_size=vocab or tensors[gguf_name(T.TOKEN_EMBD)].shape[0],
                   context_length=f.get(Keys.LLM.CONTEXT_LENGTH, int),
                   d_model=f.get(Keys.LLM.EMBEDDING_LENGTH, int),
                   n_layers=specific.pop("n_layers", None) or block_count(f, tensors),  # less MTP blocks
                   n_heads=f.get(Keys.Attention.HEAD_COUNT, int),
                   bos_token_id=f.get(Keys.Tokenizer.BOS_ID, int, None),
                   eos_token_id=f.get(Keys.Tokenizer.EOS_ID, int, None),
                   **specific)
    except (ValueError, KeyError) as e:
        raise where(f.path, str(e)) from None
