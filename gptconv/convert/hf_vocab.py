"""An HF folder's tokenizer as GGUF metadata: what llama.cpp's ``convert_hf_to_gguf.py`` writes for it.

Three kinds, chosen as the converter chooses them:
- a SentencePiece ``tokenizer.model``: model ``llama``, its pieces, scores and types (a piece the model
  marks user-defined is written normal, as the converter does), ids past the model padded as
  ``[PAD<i>]``, and the added tokens of ``added_tokens.json`` and ``tokenizer_config.json``;
- a byte-fallback BPE ``tokenizer.json`` without a ``tokenizer.model`` (Llama 2 saved by
  transformers): model ``llama`` too. The converter gives every piece the score -1000, which makes
  llama.cpp (it merges by score) tokenize differently from transformers; we score each piece by the
  rank of the merge that makes it, and llama.cpp then gives transformers' ids;
- byte-level BPE (GPT-2, Llama 3, SmolLM2, Qwen2): model ``gpt2``, tokens, merges, the
  pre-tokenizer's name.
Special token ids and the add-BOS/EOS flags follow the converter's ``gguf.SpecialVocab``:
tokenizer.json's post-processor first, then tokenizer_config.json, then config.json's ids.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from ..errors import where
from . import spm
from ..sources.hf_folder import read_json_object, token_content
from .gguf_tokenizer import BYTE, CONTROL, ID_KEYS, NORMAL, PRE_TOKENIZER_NAMES, UNUSED, USER_DEFINED, GGUFVocab

_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def looks_special(token: str) -> bool:
    """Added tokens the converter writes as control tokens even when not marked special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>")) or (token.startswith("<unused") and token.endswith(">")))


def vocab_of_folder(folder: Path, cfg: Any, tk: HFTokenizer, chat_template: str | None,
                    rules: dict[str, Any]) -> GGUFVocab:
    """The GGUF vocabulary for the tokenizer in ``folder`` (``tk``: that tokenizer, loaded) of a model
    with config ``cfg`` (ours); ``rules``: the converter's rules for the model's family (its
    ``gguf_vocab``): ``add_prefix_space_from_config`` (tokenizer_config's add_prefix_space becomes the
    space prefix), ``add_space_prefix_spm`` (the space prefix of a SentencePiece vocabulary),
    ``pre_tokenizer_first`` (the pre-tokenizer name tried first), ``special_by_text`` (role → token text: the
    added token of that text takes the role where the files give it none, GLM's)."""
    folder, n_vocab = Path(folder), cfg.vocab_size
    config = read_json_object(folder / "tokenizer_config.json")
    tokenizer_json = read_json_object(folder / "tokenizer.json")  # read once: tens of MB for a large vocabulary
    # the tokenizer's own description: its file, or as tokenizers writes it where there is none (vocab.json +
    # merges.txt) or the file's model omits its "type" (which tokenizers infers)
    typed = isinstance(tokenizer_json.get("model"), dict) and tokenizer_json["model"].get("type")
    spec = tokenizer_json if typed else json.loads(tk.to_str())
    model = spec.get("model") or {}
    if (folder / "tokenizer.model").is_file():
        vocab = _from_sentencepiece(folder, config, n_vocab)
    elif model.get("type") == "BPE" and model.get("byte_fallback") and rules.get("model") == "gemma4":
        vocab = _gemma4(folder, tk, model, n_vocab)
    elif model.get("type") == "BPE" and model.get("byte_fallback"):
        vocab = _from_byte_fallback_bpe(folder, tk, model, n_vocab)
    elif model.get("type") == "BPE":
        vocab = _from_byte_level_bpe(folder, tk, spec, n_vocab, rules.get("pre_tokenizer_first"))
    else:
        raise where(folder, f"a {model.get('type')} tokenizer cannot be written to GGUF (BPE and SentencePiece can)")
    vocab.special, vocab.add = _special_tokens(folder, config, tokenizer_json, len(vocab.tokens))
    added = {t.get("content"): t.get("id") for t in tokenizer_json.get("added_tokens") or []}
    for kind, text in rules.get("special_by_text", {}).items():  # GLM's: set where the files set none, as the
        if isinstance(added.get(text), int) and 0 <= added[text] < len(vocab.tokens):  # converter's SpecialVocab
            vocab.special.setdefault(kind, added[text])
    if vocab.model == "gemma4":  # the converter always says so
        vocab.add["bos"], vocab.add_space_prefix = True, False
    vocab.chat_template = chat_template
    if rules.get("add_prefix_space_from_config") and isinstance(config.get("add_prefix_space"), bool):
        vocab.add_space_prefix = config["add_prefix_space"]
    if "add_space_prefix_spm" in rules and (folder / "tokenizer.model").is_file():
        vocab.add_space_prefix = rules["add_space_prefix_spm"]
    return vocab


def _from_sentencepiece(folder: Path, config: dict, n_vocab: int) -> GGUFVocab:
    p = spm.read_model(folder / "tokenizer.model")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    scores, types = [-10000.0] * n_vocab, [UNUSED] * n_vocab
    for i, (piece, score, kind) in enumerate(zip(p.pieces[:n_vocab], p.scores, p.types)):
        tokens[i], scores[i], types[i] = piece, score, NORMAL if kind == USER_DEFINED else kind
    for token, i in read_json_object(folder / "added_tokens.json").items():
        if isinstance(i, int) and 0 <= i < n_vocab:
            tokens[i], scores[i], types[i] = token, -1000.0, USER_DEFINED
    for i, entry in (config.get("added_tokens_decoder") or {}).items():
        i = int(i)
        if not (isinstance(entry, dict) and isinstance(entry.get("content"), str) and 0 <= i < n_vocab):
            continue
        token = entry["content"]
        special = bool(entry.get("special")) or looks_special(token)
        tokens[i] = token if special else token.replace(spm.SPACE, " ")  # user-defined spaces pre-normalised
        scores[i], types[i] = -1000.0, CONTROL if special else USER_DEFINED
    vocab = GGUFVocab("llama", "default", tokens, types, scores)
    if not p.add_dummy_prefix:  # the converter leaves it to llama.cpp's default (a prefix), which would be wrong
        vocab.add_space_prefix = False
    return vocab


def _from_byte_fallback_bpe(folder: Path, tk: HFTokenizer, model: dict, n_vocab: int) -> GGUFVocab:
    tokens, types = _tokens(folder, tk, n_vocab)
    for i, t in enumerate(tokens):
        if types[i] == NORMAL and _BYTE_PIECE.fullmatch(t):
            types[i] = BYTE
    rank: dict[str, int] = {}
    for r, m in enumerate(model.get("merges") or []):
        left, right = m.split(" ", 1) if isinstance(m, str) else m
        rank.setdefault(left + right, r)
    # llama.cpp merges the pair whose result scores highest: the merge of lowest rank scores highest;
    # single characters and bytes are never a merge's result; any other piece no merge makes, last.
    scores = [0.0 if types[i] != NORMAL or len(t) == 1 else float(-rank.get(t, 1e9)) for i, t in enumerate(tokens)]
    return GGUFVocab("llama", "default", tokens, types, scores)


# Gemma 4's chat-format tokens the converter writes user-defined (always shown) rather than control
_GEMMA4_VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
                   "<|\"|>"}


def _gemma4(folder: Path, tk: HFTokenizer, model: dict, n_vocab: int) -> GGUFVocab:
    """llama.cpp's gemma4 vocabulary: BPE with its merges over ▁-spaced text, byte pieces as bytes, every
    score -1000 (llama.cpp merges by the merges' order), the chat-format tokens user-defined."""
    tokens, types = _tokens(folder, tk, n_vocab)
    for i, t in enumerate(tokens):
        if types[i] == NORMAL and _BYTE_PIECE.fullmatch(t):
            types[i] = BYTE
        elif t in _GEMMA4_VISIBLE:
            types[i] = USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return GGUFVocab("gemma4", None, tokens, types, [-1000.0] * len(tokens), merges)


def _from_byte_level_bpe(folder: Path, tk: HFTokenizer, spec: dict, n_vocab: int, first: str | None) -> GGUFVocab:
    tokens, types = _tokens(folder, tk, n_vocab)
    # a merge given as a pair writes its spaces as byte-level BPE's "Ġ" (the byte 0x20 shifted by 256)
    merges = [m if isinstance(m, str) else " ".join(part.replace(" ", "\u0120") for part in m)
              for m in spec["model"].get("merges", [])]
    vocab = GGUFVocab("gpt2", None, tokens, types, merges=merges)
    vocab.pre = _pre_tokenizer_name(folder, tk, vocab, first)
    return vocab


# Text on which pre-tokenizers that split differently give different ids: runs of spaces, tabs and
# newlines, digits in runs of one to eight, contractions in both cases, punctuation runs, accents,
# CJK, emoji (with joiners), mixed scripts.
CHECK_TEXT = ("\n \n\n \t\t x\r\n  y   z    \n\n\n w 7 42 314 2718 31415 271828 3141592 27182818 1.5 2..5 "
              "I'd They'RE we'Ve it's IT'S you'll He'd 'm ... !!! ??? ---- ==== ```` \"\"\" naïve café Ærø "
              "Cửa Việt 你好世界 こんにちは 안녕 🙂🚀 👩‍👩‍👧 abc123def x2024y ____ $$ 100% #tag @user")


def _pre_tokenizer_name(folder: Path, tk: HFTokenizer, vocab: GGUFVocab, first: str | None = None) -> str:
    """The llama.cpp pre-tokenizer under which this vocabulary tokenizes CHECK_TEXT as the folder's
    tokenizer does, the most specific first (as llama.cpp's converter names it by hashing the ids of
    such a text). SmolLM2's tokenizer.json, written by transformers, splits as GPT-2 does, and its
    vocabulary has no two-digit tokens, so "smollm" (digits apart) and "gpt-2" both fit: "smollm"."""
    want = tk.encode(CHECK_TEXT, add_special_tokens=False).ids
    order = ("smollm", "llama-bpe", "qwen2", "gpt-2")
    if first is not None:  # the model's own family first, where two names split this vocabulary alike
        order = (first, *(n for n in order if n != first))
    for name in order:
        vocab.pre = name
        if vocab.tokenizer(folder).encode(CHECK_TEXT, add_special_tokens=False).ids == want:
            return name
    raise where(folder, f"the tokenizer splits text as no pre-tokenizer llama.cpp knows by name "
                        f"({', '.join(PRE_TOKENIZER_NAMES)}) does")


def _tokens(folder: Path, tk: HFTokenizer, n_vocab: int) -> tuple[list[str], list[int]]:
    """Tokens and types in id order; ids the tokenizer never produces (embedding rows beyond it) as
    unused ``[PAD<i>]``; added tokens as control (special, or looking special) or user-defined."""
    vocab = tk.get_vocab(with_added_tokens=True)
    if max(vocab.values()) >= n_vocab:
        raise where(folder, f"the tokenizer has ids up to {max(vocab.values())}, the model only {n_vocab}")
    tokens, types = [f"[PAD{i}]" for i in range(n_vocab)], [UNUSED] * n_vocab
    for token, i in vocab.items():
        tokens[i], types[i] = token, NORMAL
    for i, added in tk.get_added_tokens_decoder().items():
        if added.special or looks_special(added.content):
            types[i] = CONTROL
        else:
            tokens[i], types[i] = added.content.replace(spm.SPACE, " "), USER_DEFINED
    return tokens, types


def _special_tokens(folder: Path, config: dict, tokenizer_json: dict,
                    n_vocab: int) -> tuple[dict[str, int], dict[str, bool]]:
    """(special token ids, add-BOS/EOS flags) as ``gguf.SpecialVocab`` finds them (``tokenizer_json``:
    the folder's tokenizer.json, {} without one)."""
    special: dict[str, int] = {}
    add: dict[str, bool] = {}
    names = {kind: token_content(config.get(f"{kind}_token")) for kind in ID_KEYS}
    if tokenizer_json:
        processor = tokenizer_json.get("post_processor") or {}
        for p in processor.get("processors", [processor]) if processor else []:
            if p.get("type") == "ByteLevel":
                add.setdefault("bos", False)
                add.setdefault("eos", False)
            elif p.get("type") == "RobertaProcessing":
                add.update(bos=True, eos=True, sep=True)
            elif p.get("type") == "TemplateProcessing":
                single = p.get("single") or []
                first = (single[0].get("SpecialToken") or {}).get("id") if len(single) > 1 else None
                last = (single[-1].get("SpecialToken") or {}).get("id") if len(single) > 1 else None
                if first:
                    names["bos"] = names["bos"] or first
                    add["bos"] = first == names["bos"]
                if last:
                    names["eos"] = names["eos"] or last
                    add["eos"] = last == names["eos"]
                pair = [(x.get("SpecialToken") or {}).get("id") or (x.get("Sequence") or {}).get("id")
                        for x in p.get("pair") or []]
                if "A" in pair and "B" in pair and pair.index("B") > pair.index("A") + 1:  # A <sep> B
                    middle = pair[pair.index("A") + 1:pair.index("B")]
                    add["sep"] = (middle[0] in (names["sep"], names["eos"]) and not last) or (
                        len(middle) == 2 and middle[1] in (names["sep"], names["eos"]))
        added = {t.get("content"): t.get("id") for t in reversed(tokenizer_json.get("added_tokens") or [])}
        for kind, name in names.items() if config else ():  # SpecialVocab reads ids only beside a tokenizer_config
            if name is not None and isinstance(added.get(name), int) and 0 <= added[name] < n_vocab:
                special[kind] = added[name]
    if config:
        for kind in ("bos", "eos", "sep"):
            if isinstance(config.get(f"add_{kind}_token"), bool):
                add.setdefault(kind, config[f"add_{kind}_token"])
    model_config = read_json_object(folder / "config.json")
    text_config = model_config.get("text_config")  # a multimodal checkpoint: its text model's ids, as the converter
    if isinstance(text_config, dict):                # reads them
        model_config = {**text_config, **{k: v for k, v in model_config.items() if v is not None}}
    for kind in ID_KEYS:
        value = model_config.get(f"{kind}_token_id")
        if kind not in special and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n_vocab:
            special[kind] = value
    return special, add
