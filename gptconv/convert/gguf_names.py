"""llama.cpp's tensor names, from gguf-py's own table (``gguf.TENSOR_NAMES``), for our key maps."""

from __future__ import annotations

from gguf import MODEL_TENSOR, TENSOR_NAMES

T = MODEL_TENSOR


def gguf_name(tensor: MODEL_TENSOR, part: str = "weight") -> str:
    """``blk.{i}.attn_q.weight`` for ``(ATTN_Q, "weight")``: gguf's name, with the key map's ``{i}``."""
    return f"{TENSOR_NAMES[tensor].replace('{bid}', '{i}')}.{part}"
