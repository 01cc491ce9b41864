"""The tokenizer a GGUF file embeds (vocabulary, merges, token types) as a ``tokenizers`` Tokenizer.

Only byte-level BPE (``tokenizer.ggml.model = gpt2``) is built; its pre-tokenizer follows
``tokenizer.ggml.pre`` the way llama.cpp splits text for that name.
"""

from __future__ import annotations

import json

from gguf import Keys
from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from ..errors import where
from .gguf import GGUFFields

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _pre_tokenizer(name: str) -> pre_tokenizers.PreTokenizer | None:
    if name in ("gpt-2", "gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    if name == "smollm":  # SmolLM2's own tokenizer.json: every digit apart, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    if name in ("llama-bpe", "llama3", "llama-v3", "smaug-bpe"):
        return _split_then_bytes(_LLAMA3_SPLIT)
    if name in ("qwen2", "deepseek-r1-qwen"):
        return _split_then_bytes(_QWEN2_SPLIT)
    return None


PRE_TOKENIZER_NAMES = ("gpt-2", "smollm", "llama-bpe", "qwen2")  # as llama.cpp spells them


def _signature(spec: dict | None) -> object:
    """What decides how a pre-tokenizer splits text, from its JSON (flags that only touch offsets dropped)."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        return tuple(_signature(p) for p in spec["pretokenizers"])
    if kind == "ByteLevel":
        return (kind, spec.get("add_prefix_space"), spec.get("use_regex", True))
    if kind == "Split":
        return (kind, json.dumps(spec.get("pattern"), sort_keys=True), spec.get("behavior"), spec.get("invert"))
    if kind == "Digits":
        return (kind, spec.get("individual_digits"))
    return (kind, json.dumps(spec, sort_keys=True))


def pre_tokenizer_for(spec: dict | None) -> str | None:
    """The llama.cpp name (``tokenizer.ggml.pre``) of the pre-tokenizer a tokenizer.json describes."""
    for name in PRE_TOKENIZER_NAMES:
        probe = HFTokenizer(models.BPE())
        probe.pre_tokenizer = _pre_tokenizer(name)
        if _signature(json.loads(probe.to_str())["pre_tokenizer"]) == _signature(spec):
            return name
    return None


CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


def tokenizer_from_gguf(f: GGUFFields) -> tuple[HFTokenizer, str | None]:
    """(tokenizer, chat template) from the file's tokenizer.* metadata."""
    model = f.get(Keys.Tokenizer.MODEL, str)
    if model != "gpt2":
        raise where(f.path, f"tokenizer model '{model}' is not supported (only byte-level BPE, 'gpt2')")
    pre_name = f.get(Keys.Tokenizer.PRE, str, "default")
    pre = _pre_tokenizer(pre_name)
    if pre is None:
        raise where(f.path, f"pre-tokenizer '{pre_name}' is not supported")
    tokens = f.get(Keys.Tokenizer.LIST, list)
    merges = [tuple(m.split(" ", 1)) for m in f.get(Keys.Tokenizer.MERGES, list)]
    types = f.get(Keys.Tokenizer.TOKEN_TYPE, list, [1] * len(tokens))
    if len(types) != len(tokens) or any(len(m) != 2 for m in merges):
        raise where(f.path, "tokenizer metadata is inconsistent (token types or merges malformed)")
    tk = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tk.pre_tokenizer = pre
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, kind in zip(tokens, types) if kind == CONTROL])
    tk.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    bos = f.get(Keys.Tokenizer.BOS_ID, int, None)
    if f.get(Keys.Tokenizer.ADD_BOS, bool, False) and bos is not None:
        tk.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                          special_tokens=[(tokens[bos], bos)])
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk, f.get(Keys.Tokenizer.CHAT_TEMPLATE, str, None)
