"""Text ↔ token ids with the ``tokenizers`` library, from a checkpoint's own tokenizer files."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from .sources.hf_folder import read_json_object, token_content
from .errors import GptconvError, NoTokenizer, first_line, where
from .sources.files import read_text, regular_file


@contextlib.contextmanager
def rust_panics(what: str) -> Iterator[None]:
    """A panic inside the ``tokenizers`` library (a backtracking Split regex in a hostile tokenizer.json
    exhausts Oniguruma's retry limit) as a GptconvError. pyo3's PanicException is a BaseException, and
    Rust prints the panic on stderr itself, so stderr is held for the call and dropped on a panic;
    one thread at a time (fd 2 is the process's: two threads swapping it would restore each other's)."""
    with _STDERR_SWAP:
        yield from _held_stderr(what)


_STDERR_SWAP = threading.RLock()


def _held_stderr(what: str) -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException as e:
            if type(e).__name__ != "PanicException":
                raise
            raise GptconvError(f"{what} ({first_line(e)})") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = held.read()
        if kept and b"panicked" not in kept:  # what the library printed for other reasons still shows
            os.write(2, kept)


PIECE = 1 << 16  # characters tokenized in one call by encode_long
MARGIN = 1 << 12  # characters of context on either side of a piece


class Tokenizer:
    def __init__(self, tk: HFTokenizer, eos_id: int | None = None, bos_id: int | None = None,
                 chat_template: str | None = None, pad_id: int | None = None, unk_id: int | None = None) -> None:
        self.tk, self.eos_id, self.bos_id, self.chat_template = tk, eos_id, bos_id, chat_template
        self.pad_id, self.unk_id = pad_id, unk_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Special tokens written in ``text`` (``<|endoftext|>``) become their ids, as in transformers."""
        with rust_panics("the tokenizer failed on this text"):
            return self.tk.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_long(self, text: str) -> torch.Tensor:
        """``encode(text)`` as a (N,) int64 tensor, for texts of any length (perplexity's): tokenized in
        pieces, so that memory stays a small multiple of the text (one call on a whole 8 MB text took
        2 GB: the library keeps every token's string and offsets). Each piece is tokenized with some
        text on either side, and two neighbours must give the same tokens where they overlap, so the
        ids are those of one call; where they do not (a tokenizer whose splits depend on distant
        text), the text is tokenized whole."""
        if len(text) <= 2 * PIECE:
            return torch.tensor(self.encode(text), dtype=torch.long)
        with rust_panics("the tokenizer failed on this text"):
            return self._stitched(text)

    def _stitched(self, text: str) -> torch.Tensor:
        sample = "Hello"  # what the post-processor adds around any text: BOS, EOS
        plain, full = self.tk.encode(sample, add_special_tokens=False).ids, self.tk.encode(sample).ids
        at = next((i for i in range(len(full)) if full[i:i + len(plain)] == plain), None)
        if at is None:
            return torch.tensor(self.encode(text), dtype=torch.long)
        before, after = full[:at], full[at + len(plain):]
        pieces = [torch.tensor(before, dtype=torch.long)]
        pos, promised = 0, None  # promised: (start, id) of the previous piece's tokens past its cut
        while True:
            lo, end = max(0, pos - MARGIN), pos + PIECE
            last = end + MARGIN >= len(text)
            hi = len(text) if last else end + MARGIN
            enc = self.tk.encode(text[lo:hi], add_special_tokens=False)
            starts = [a + lo for a, _ in enc.offsets]
            first = next((i for i, a in enumerate(starts) if a >= pos), len(starts))
            if promised is not None:  # the overlap, tokenized twice, must agree token for token
                here = list(zip(starts[first:first + len(promised)], enc.ids[first:first + len(promised)]))
                if starts[first:first + 1] != [pos] or here != promised:
                    return torch.tensor(self.encode(text), dtype=torch.long)
            cut = len(starts) if last else next(i for i, a in enumerate(starts) if a >= end)
            pieces.append(torch.tensor(enc.ids[first:cut], dtype=torch.long))
            if last:
                break
            # the tokens past the cut and well before the piece's end, for the next piece to confirm
            safe = hi - MARGIN // 2
            promised = [(a, t) for a, t, (_, b) in zip(starts[cut:], enc.ids[cut:], enc.offsets[cut:]) if b + lo <= safe]
            pos = starts[cut]
        pieces.append(torch.tensor(after, dtype=torch.long))
        return torch.cat(pieces)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        with rust_panics("the tokenizer failed to decode these ids"):  # a decoder has regexes too
            return self.tk.decode(ids, skip_special_tokens=skip_special_tokens)

    def token(self, id: int) -> str:
        return self.tk.id_to_token(id)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The checkpoint's chat template, rendered sandboxed and bounded (``chat_template.py``)."""
        if self.chat_template is None:
            raise GptconvError("this model has no chat template")
        from .chat_template import render
        special = lambda i: self.token(i) if i is not None else ""  # noqa: E731
        return render(self.chat_template, messages=messages, add_generation_prompt=add_generation_prompt,
                      bos_token=special(self.bos_id), eos_token=special(self.eos_id))

    @classmethod
    def from_folder(cls, folder: Path, eos_id: int | None = None, bos_id: int | None = None) -> Tokenizer:
        """``tokenizer.json`` if present, else a SentencePiece ``tokenizer.model``, else GPT-2's
        ``vocab.json`` + ``merges.txt``; the chat template from tokenizer_config.json, else from
        ``chat_template.jinja`` (what transformers 5 saves) or ``chat_template.json``."""
        folder = Path(folder)
        config = read_json_object(folder / "tokenizer_config.json")
        special_map = read_json_object(folder / "special_tokens_map.json")
        if (folder / "tokenizer.json").exists():
            text = read_text(folder / "tokenizer.json")
            try:
                with rust_panics(f"{folder / 'tokenizer.json'}: not a usable tokenizer"):
                    tk = HFTokenizer.from_str(text)
            except GptconvError:
                raise
            except Exception as e:  # the library raises plain Exception for a corrupt file
                raise where(folder / "tokenizer.json", f"not a readable tokenizer ({first_line(e)})") from None
            if config.get("tokenizer_class") in ("LlamaTokenizer", "LlamaTokenizerFast"):
                _as_transformers_llama(tk, config)
        elif (folder / "tokenizer.model").exists():
            tk = _sentencepiece(folder / "tokenizer.model", config, special_map)
        elif (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
            tk = _byte_level_bpe(folder)
        else:
            raise NoTokenizer(f"{folder}: no tokenizer: expected tokenizer.json, tokenizer.model, or vocab.json "
                              "and merges.txt")
        _add_special_tokens(tk, config, special_map)
        ids = {kind: _token_id(tk, config, special_map, kind) for kind in ("pad", "unk")}
        return cls(tk, eos_id, bos_id, chat_template(folder, config), ids["pad"], ids["unk"])


def _as_transformers_llama(tk: HFTokenizer, config: dict) -> None:
    """transformers 5's Llama tokenizer replaces the whitespace handling of the tokenizer.json it loads:
    Metaspace, with the prefix on the first piece of text only (after a special token too) unless
    tokenizer_config.json says ``legacy: true``, and none with ``add_prefix_space: false``."""
    spec = json.loads(tk.to_str())
    if (spec.get("model") or {}).get("type") != "BPE" or not spec["model"].get("byte_fallback"):
        return
    prefix = config.get("add_prefix_space", True) is not False
    scheme = ("always" if config.get("legacy", False) is True else "first") if prefix else "never"
    tk.normalizer = None
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                   + ([decoders.Strip(" ", 1, 0)] if prefix else []))


def chat_template(folder: Path, config: dict) -> str | None:
    """The folder's chat template as transformers takes it: chat_template.jinja (its own file takes
    priority), else tokenizer_config.json's, else chat_template.json's."""
    if os.path.lexists(folder / "chat_template.jinja"):
        return read_text(folder / "chat_template.jinja")
    template = config_chat_template(config)
    if template is not None:
        return template
    template = read_json_object(folder / "chat_template.json").get("chat_template")
    return template if isinstance(template, str) else None


def config_chat_template(config: dict) -> str | None:
    """tokenizer_config.json's chat template (of several named ones, the default), if it has one."""
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def _sentencepiece(path: Path, config: dict, special_map: dict) -> HFTokenizer:
    """A bare tokenizer.model (see ``convert/spm.py``); BOS added unless tokenizer_config.json says not,
    as transformers' Llama tokenizer does."""
    from .convert import spm
    pieces = spm.read_model(path)
    if isinstance(config.get("add_prefix_space"), bool):
        pieces.add_dummy_prefix = config["add_prefix_space"]

    def special(kind: str, default: str) -> str | None:
        name = token_content(special_map.get(f"{kind}_token", config.get(f"{kind}_token"))) or default
        return name if name in pieces.pieces else None
    return spm.build(pieces, special("bos", "<s>"), special("eos", "</s>"), config.get("add_bos_token", True) is True,
                     config.get("add_eos_token", False) is True)


def _token_id(tk: HFTokenizer, config: dict, special_map: dict, kind: str) -> int | None:
    name = token_content(special_map.get(f"{kind}_token", config.get(f"{kind}_token")))
    return tk.token_to_id(name) if name is not None else None


def _byte_level_bpe(folder: Path) -> HFTokenizer:
    # GPT-2's byte-level BPE, assembled the way transformers' GPT2 converter does it.
    for name in ("vocab.json", "merges.txt"):
        regular_file(folder / name)
    try:
        bpe = models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    except Exception as e:
        raise where(folder, f"vocab.json / merges.txt are not a BPE vocabulary ({e})") from None
    tk = HFTokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk


def _add_special_tokens(tk: HFTokenizer, config: dict, special_map: dict) -> None:
    """Tokens transformers treats as special (matched whole in text, never split)."""
    names = []
    for entry in (config.get("added_tokens_decoder") or {}).values():
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            names.append(entry["content"])
    for source in (special_map, config):
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = source.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                names.append(value)
    known = tk.get_vocab(with_added_tokens=True)
    # Only tokens the vocabulary has: marking them special must never create new ids.
    tk.add_special_tokens([n for n in dict.fromkeys(names) if n in known])


def load_tokenizer(source: object) -> Tokenizer:
    """The tokenizer of an opened source (see ``gptconv.loader.open_source``)."""
    if source.format == "gguf":
        return gguf_tokenizer(source.gguf.fields)
    cfg = source.config
    return Tokenizer.from_folder(source.path, cfg.eos_token_id, cfg.bos_token_id)


def gguf_tokenizer(fields) -> Tokenizer:
    """The tokenizer a GGUF file carries, giving llama.cpp's ids (``convert/gguf_tokenizer.py``)."""
    from .convert.gguf_tokenizer import GGUFVocab
    vocab = GGUFVocab.read(fields)
    s = vocab.special
    return Tokenizer(vocab.tokenizer(fields.path), s.get("eos"), s.get("bos"), vocab.chat_template, s.get("pad"),
                     s.get("unk"))


def tokenizer_or_none(src: object) -> Tokenizer | None:
    """The checkpoint's tokenizer, or None where it has none at all."""
    try:
        return load_tokenizer(src)
    except NoTokenizer:  # none at all; one that cannot be read is an error
        return None
